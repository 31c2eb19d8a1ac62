#!/usr/bin/env bash
# On the GPU machine (CUDA torch, transformers and onnxruntime-gpu importable; SITE=/tmp/site is put first on
# PYTHONPATH if it exists): device memory of the native-step artifacts after two pages, in one call of ~6 min.
#   1. the real-size architecture on random weights, FP16 export (gqa, selection in the graph, 4,096-token cache),
#      fused for CUDA ($W/slots1-fused, scripts/gpu_realsize.sh, so that gpu_slots_bench.sh reuses it), and its
#      native-step forms: FP16 weights, 8-bit weights, 8-bit weights and embedding (the 8-bit lm_head's rows
#      padded to a multiple of 8: ONNX Runtime's one-row MatMulNBits kernel instead of a dequantized copy)
#   2. scripts/gpu_perf.py memory of each with the runtime's settings, and with the weights allocated outside the
#      arena (--config initializers); the FP16 one with its vision arena kept too
#   3. `edgeocr bench` of the 8-bit-embedding artifact (decode, first token) and its native step's tokens against
#      ONNX Runtime's step on two eval pages; with CACHE2048=1 also an FP16 export with a 2,048-row cache
# Everything lands in $OUT/results.tar.gz.
set -uo pipefail
# shellcheck source=scripts/gpu_call_common.sh
source "$(dirname "$0")/gpu_call_common.sh" /tmp/work
# shellcheck source=scripts/gpu_realsize.sh
source "$(dirname "$0")/gpu_realsize.sh"

say "-- real-size FP16 export, fused for CUDA"
realsize_slots 1 >> "$R/run.log" 2>&1 || { say "build failed"; exit 1; }
F=$SLOTS_ART
NATIVE=float realsize_slots 1 >> "$R/run.log" 2>&1 || { say "native-step float failed"; exit 1; }
[ -f "$F-native-int8w/manifest.json" ] || run native8 90 $PY -m quantize native-step "$F" "$F-native-int8w" \
  --weights int8 --embedding float
[ -f "$F-native-int8e/manifest.json" ] || run native8e 90 $PY -m quantize native-step "$F" "$F-native-int8e" \
  --weights int8 --embedding int8

memory() { local name=$1 art=$2 config=$3; shift 3
  [ -d "$art" ] && run "memory_$name" 90 env EDGEOCR_NATIVE_STEP=1 "$@" $PY scripts/gpu_perf.py memory "$art" \
    --config "$config" --device cuda --tokens 256 --image "$IMG" --json "$R/memory_$name.json"; }
memory native "$F-native-float" runtime
memory native8 "$F-native-int8w" runtime
memory native8e "$F-native-int8e" runtime
memory native_init "$F-native-float" initializers
memory native8e_init "$F-native-int8e" initializers
memory native_keep "$F-native-float" runtime EDGEOCR_VISION_ARENA=keep

run bench_native8e 90 env EDGEOCR_NATIVE_STEP=1 $PY -m edgeocr bench "$F-native-int8e" --device cuda --tokens 256 \
  --repeats 2 --cuda-graph on --image "$IMG" --json "$R/bench_native8e.json"
run tokens_native8e 120 $PY scripts/native_step_tokens.py "$R/tokens_native8e.json" "$F-native-int8e"

if [ "${CACHE2048:-0}" = 1 ]; then
  C=$W/real-fp16-gqa-c2048
  [ -f "$C/manifest.json" ] || run export_c2048 120 $PY -m quantize export "$W/real-ckpt" "$C" --precision fp16 \
    --device cuda --attention gqa --select-on-device --cache-len 2048
  [ -f "$C-fused/manifest.json" ] || run fuse_c2048 90 $PY -m quantize fuse "$C" "$C-fused" --target cuda
  [ -f "$C-fused-native/manifest.json" ] || run native_c2048 90 $PY -m quantize native-step "$C-fused" \
    "$C-fused-native"
  memory native_c2048 "$C-fused-native" runtime
fi
