#!/usr/bin/env bash
# On the GPU machine (CUDA torch, transformers and onnxruntime-gpu importable; SITE=/tmp/site is put first on
# PYTHONPATH if it exists): the vision graph with and without quantize.fuse's vision GEMM passes (attention_qkv:
# q, k, v as three MatMuls, no Split; patch_gemm: the patch embedding's Conv as one MatMul), the runtime's defaults
# otherwise.
#   1. the real-size architecture on random weights, FP16 export (gqa, selection in the graph, 4,096-token cache),
#      fused for CUDA (the default passes) and its native-step forms (scripts/gpu_realsize.sh); the same export
#      fused with --vision-gemms and its native-step forms
#   2. scripts/gpu_profile.py of both FP16 native forms: the vision graph's kernels
#   3. `edgeocr bench` of both (first token: medians of 7 one-token calls), in the order before, after, before,
#      after (the host part moves by ms between runs of the same code)
#   4. scripts/gpu_perf.py memory after 4 pages of 256 tokens, the --vision-gemms native forms
# Everything lands in $OUT/results.tar.gz.
set -uo pipefail
# shellcheck source=scripts/gpu_call_common.sh
source "$(dirname "$0")/gpu_call_common.sh" /tmp/work
# shellcheck source=scripts/gpu_realsize.sh
source "$(dirname "$0")/gpu_realsize.sh"

say "-- real-size FP16 export, fused for CUDA, native step"
realsize_native_forms >> "$R/run.log" 2>&1 || { say "build failed"; exit 1; }
NEW=$W/slots1-fused-gemms
run fuse_with_vision_gemms 300 $PY -m quantize fuse "$W/slots1" "$NEW" --target cuda --vision-gemms || exit 1
for form in float int8; do
  run "native_with_vision_gemms_$form" 300 $PY -m quantize native-step "$NEW" "$NEW-native-$form" --weights $form \
    || exit 1
done
PAGES=("$ROOT"/calibration_data/eval/00000[0-3].jpg)
declare -A ART=([before]="$F-native-float" [after]="$NEW-native-float")
for v in before after; do
  run "profile_$v" 180 env EDGEOCR_NATIVE_STEP=1 $PY scripts/gpu_profile.py "${ART[$v]}" --steps 16 --cuda-graph \
    --label "$v" --json "$R/profile_$v.json"
done
for k in 1 2; do
  for v in before after; do
    run "bench_${v}_$k" 120 env EDGEOCR_NATIVE_STEP=1 $PY -m edgeocr bench "${ART[$v]}" --device cuda --tokens 256 \
      --repeats 2 --image "$IMG" --json "$R/bench_${v}_$k.json"
  done
done
for form in float int8; do
  run "memory_$form" 120 env EDGEOCR_NATIVE_STEP=1 $PY scripts/gpu_perf.py memory "$NEW-native-$form" --config runtime \
    --device cuda --tokens 256 --pages 4 --image "${PAGES[@]}" --json "$R/memory_$form.json"
done
