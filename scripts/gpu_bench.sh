#!/usr/bin/env bash
# On the GPU test machine (H200; CUDA torch + transformers preinstalled, onnxruntime-gpu in /tmp/site).
#   PHASE=prep:  GPU tests (pytest -m gpu), the real-size architecture on random weights, its FP16 exports
#                (portable masked graph; gqa + in-graph selection) and the weight-only INT8 copy.
#   PHASE=bench: `edgeocr bench` of each flavour (same image, 256 tokens fixed length), the masked one
#                against transformers generate; a 1,024-token run for per-position flatness.
# Logs and JSON under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TOKENS=${TOKENS:-256}
W=/tmp/work; mkdir -p $W
if [ "${PHASE:-prep}" = prep ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import onnxruntime as o, torch, transformers; print('ort', o.__version__, o.get_available_providers(), '| torch', torch.__version__, '| transformers', transformers.__version__)"
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -30 > "$OUT/gpu_tests.log"
  [ -d $W/real-ckpt ] || python3 -m quantize.realsize $W/real-ckpt 2>&1 | tail -1
  for spec in "real-fp16:" "real-fp16-gqa:--attention gqa --select-on-device"; do
    name=${spec%%:*}; flags=${spec#*:}
    [ -f $W/$name/manifest.json ] || /usr/bin/time -f "$name export wall %e s, peak RSS %M KiB" python3 -m quantize export \
      $W/real-ckpt $W/$name --precision fp16 --max-cache-len 4096 --device cuda $flags 2>&1 | tail -4 | tee -a "$OUT/exports.log"
  done
  [ -f $W/real-w8-gqa/manifest.json ] || python3 -m quantize weight-int8 $W/real-fp16-gqa $W/real-w8-gqa 2>&1 \
    | tail -8 | tee -a "$OUT/exports.log"
  cat "$OUT/gpu_tests.log"
else
  b() { name=$1; shift; python3 -m edgeocr bench "$@" --device cuda --repeats 2 --json "$OUT/bench_$name.json" 2>&1 \
        | tee "$OUT/bench_$name.txt"; }
  b fp16_masked $W/real-fp16 --tokens $TOKENS --compare-transformers $W/real-ckpt
  b fp16_gqa $W/real-fp16-gqa --tokens $TOKENS
  b fp16_gqa_graph $W/real-fp16-gqa --tokens $TOKENS --cuda-graph
  b w8_gqa_graph $W/real-w8-gqa --tokens $TOKENS --cuda-graph
  b fp16_gqa_graph_1024 $W/real-fp16-gqa --tokens 1024 --cuda-graph
  b w8_gqa_graph_1024 $W/real-w8-gqa --tokens 1024 --cuda-graph
fi
