#!/usr/bin/env bash
# On the GPU machine (CUDA torch, transformers and onnxruntime-gpu importable; SITE=/tmp/site first on PYTHONPATH if
# it exists): the 8-bit vision's q, k and v as one packed MatMul into MultiHeadAttention's packed input
# (`quantize native-step --vision-qkv packed`, the default for a CUDA fusion) against three MatMuls (`--vision-qkv
# three`), docs/perf.md section 24.
#   1. with MICRO=1 (the default) scripts/gpu_vision_qkv_bench.py: the attention block alone
#   2. the real-size architecture on random weights, FP16 export (gqa, selection in the graph, 4,096-token cache),
#      fused for CUDA, made into the 8-bit native-step artifact twice: --vision-qkv three and packed
#   3. both vision graphs on ONNX Runtime CUDA over the same pixels: the largest difference of their embeddings
#   4. `edgeocr bench` (first token: medians of 7 one-token calls) of each, ROUNDS times (default 3), alternating
#   5. scripts/gpu_perf.py memory after 4 pages of 256 tokens, and scripts/gpu_profile.py, of each
# Everything lands in $OUT/results.tar.gz.
set -uo pipefail
# shellcheck source=scripts/gpu_call_common.sh
source "$(dirname "$0")/gpu_call_common.sh" /tmp/work
# shellcheck source=scripts/gpu_realsize.sh
source "$(dirname "$0")/gpu_realsize.sh"

[ "${MICRO:-1}" = 1 ] && run vision_qkv_block 200 $PY scripts/gpu_vision_qkv_bench.py --json "$R/vision_qkv_block.json"
say "-- real-size FP16 export, fused for CUDA, 8-bit native step with three and packed q|k|v"
NATIVE=0 realsize_slots 1 >> "$R/run.log" 2>&1 || { say "build failed"; exit 1; }
F=$W/slots1-fused
declare -A ART=([three]="$F-native-int8" [packed]="$F-native-int8-packed")
run native_three 300 $PY -m quantize native-step "$F" "${ART[three]}" --weights int8 --vision-qkv three || exit 1
run native_packed 300 $PY -m quantize native-step "$F" "${ART[packed]}" --weights int8 --vision-qkv packed || exit 1
run embeddings 120 $PY - "${ART[three]}" "${ART[packed]}" "$R/embeddings.json" <<'EOF'
import json, sys
import numpy as np, onnxruntime as ort
from edgeocr.artifact import read
x = np.random.default_rng(5).standard_normal((1, 3, 1024, 1024)).astype(np.float32)
out = {}
for name, d in zip(("three", "packed"), sys.argv[1:3]):
    s = ort.InferenceSession(f"{d}/{read(d).vision.file}", providers=["CUDAExecutionProvider"])
    out[name] = s.run(None, {"pixels": x})[0].astype(np.float32)
a, b = out["three"], out["packed"]
r = {"max_abs_diff": float(np.abs(a - b).max()), "max_abs": float(np.abs(a).max()),
     "cosine": float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))}
print(r); json.dump(r, open(sys.argv[3], "w"))
EOF
PAGES=("$ROOT"/calibration_data/eval/00000[0-3].jpg)
for k in $(seq 1 "${ROUNDS:-3}"); do
  for form in three packed; do
    run "bench_${form}_$k" 60 env EDGEOCR_NATIVE_STEP=1 $PY -m edgeocr bench "${ART[$form]}" --device cuda \
      --tokens 64 --repeats 1 --image "$IMG" --json "$R/bench_${form}_$k.json"
  done
done
for form in three packed; do
  run "memory_$form" 60 env EDGEOCR_NATIVE_STEP=1 $PY scripts/gpu_perf.py memory "${ART[$form]}" --config runtime \
    --device cuda --tokens 256 --pages 4 --image "${PAGES[@]}" --json "$R/memory_$form.json"
  run "profile_$form" 90 $PY scripts/gpu_profile.py "${ART[$form]}" --steps 16 --sequence 40 --label "$form" \
    --json "$R/profile_$form.json"
done
