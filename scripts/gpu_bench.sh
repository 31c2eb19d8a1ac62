#!/usr/bin/env bash
# On the GPU test machine (H200, CUDA torch + transformers preinstalled, onnxruntime-gpu in /tmp/site):
# CUDA-vs-CPU parity on tiny models, then the real-size architecture (random weights): FP16 export
# and `edgeocr bench` against transformers generate.  Writes logs and JSON under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TOKENS=${TOKENS:-256}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import onnxruntime as o, torch, transformers; print('ort', o.__version__, o.get_available_providers(), '| torch', torch.__version__, '| transformers', transformers.__version__)"
python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -5 | tee "$OUT/gpu_tests.log"
W=/tmp/work; mkdir -p $W
[ -d $W/real-ckpt ] || python3 -m quantize.realsize $W/real-ckpt 2>&1 | tail -1
if [ ! -f $W/real-fp16/manifest.json ]; then
  /usr/bin/time -f "export wall %e s, peak RSS %M KiB" python3 -m quantize export $W/real-ckpt $W/real-fp16 \
    --precision fp16 --max-cache-len 4096 --device cuda 2>&1 | tail -8 | tee "$OUT/export_fp16.log"
fi
python3 -m edgeocr bench $W/real-fp16 --device cuda --tokens $TOKENS --repeats 2 \
  --compare-transformers $W/real-ckpt --json "$OUT/bench_fp16.json" 2>&1 | tee "$OUT/bench_fp16.txt"
# the GroupQueryAttention flavour: cache written in place, attention over the live length only
if [ "${GQA:-1}" = 1 ]; then
  [ -f $W/real-fp16-gqa/manifest.json ] || python3 -m quantize export $W/real-ckpt $W/real-fp16-gqa \
    --precision fp16 --max-cache-len 4096 --device cuda --attention gqa --select-on-device 2>&1 | tail -3 \
    | tee "$OUT/export_fp16_gqa.log"
  python3 -m edgeocr bench $W/real-fp16-gqa --device cuda --tokens $TOKENS --repeats 2 \
    --json "$OUT/bench_fp16_gqa.json" 2>&1 | tee "$OUT/bench_fp16_gqa.txt"
  python3 -m edgeocr bench $W/real-fp16-gqa --device cuda --tokens $TOKENS --repeats 2 --cuda-graph \
    --json "$OUT/bench_fp16_gqa_graph.json" 2>&1 | tee "$OUT/bench_fp16_gqa_graph.txt"
fi
