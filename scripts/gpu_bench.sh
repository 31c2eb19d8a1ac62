#!/usr/bin/env bash
# On the GPU test machine (H200; CUDA torch + transformers preinstalled, onnxruntime-gpu in /tmp/site).
#   PHASE=prep:  GPU tests (pytest -m gpu), the real-size architecture on random weights, its FP16 exports
#                (portable masked graph unless SKIP_MASKED=1; gqa + in-graph selection, also with a 16,384-token
#                cache) and the weight-only INT8 copy.
#   PHASE=bench: `edgeocr bench` of each flavour (same image, 256 tokens fixed length) against transformers
#                generate; 1,024-token runs for per-position flatness; the kernel profile of the fast flavour.
# Logs and JSON under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TOKENS=${TOKENS:-256}
W=/tmp/work; mkdir -p $W
ex() { name=$1; shift; [ -f $W/$name/manifest.json ] || /usr/bin/time -f "$name export wall %e s" python3 -m quantize \
       export $W/real-ckpt $W/$name --precision fp16 --device cuda "$@" 2>&1 | tail -2 | tee -a "$OUT/exports.log"; }
if [ "${PHASE:-prep}" = prep ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import onnxruntime as o, torch, transformers; print('ort', o.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py ${GPU_TESTS:-} 2>&1 | tail -30 > "$OUT/gpu_tests.log"
  [ -d $W/real-ckpt ] || python3 -m quantize.realsize $W/real-ckpt 2>&1 | tail -1
  [ "${SKIP_MASKED:-0}" = 1 ] || ex real-fp16 --max-cache-len 4096
  ex real-fp16-gqa --max-cache-len 4096 --attention gqa --select-on-device
  ex real-fp16-gqa-16k --max-cache-len 16384 --attention gqa --select-on-device
  [ -f $W/real-w8-gqa/manifest.json ] || python3 -m quantize weight-int8 $W/real-fp16-gqa $W/real-w8-gqa 2>&1 \
    | tail -3 | tee -a "$OUT/exports.log"
  cat "$OUT/gpu_tests.log"
else
  b() { name=$1; shift; python3 -m edgeocr bench "$@" --device cuda --repeats 2 --json "$OUT/bench_$name.json" >> \
        "$OUT/bench.log" 2>&1; }
  [ "${SKIP_MASKED:-0}" = 1 ] || b fp16_masked $W/real-fp16 --tokens $TOKENS
  b fp16_gqa_graph $W/real-fp16-gqa --tokens $TOKENS --cuda-graph on --compare-transformers $W/real-ckpt
  b w8_gqa_graph $W/real-w8-gqa --tokens $TOKENS --cuda-graph on
  b fp16_gqa_graph_1024 $W/real-fp16-gqa --tokens 1024 --cuda-graph on
  b fp16_gqa16k_graph_1024 $W/real-fp16-gqa-16k --tokens 1024 --cuda-graph on
  python3 scripts/gpu_profile.py $W/real-fp16-gqa --cuda-graph > "$OUT/profile.txt" 2>&1
  python3 scripts/gpu_profile.py $W/real-w8-gqa --cuda-graph 2>&1 | grep -A14 "== decode" >> "$OUT/profile.txt"
fi
