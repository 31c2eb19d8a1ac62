#!/usr/bin/env bash
# On the GPU machine (CUDA torch, transformers and onnxruntime-gpu importable; SITE=/tmp/site is put first on
# PYTHONPATH if it exists): where the first token's milliseconds and the vision session's memory go, for the
# levers left on the first token (docs/perf.md section 18).
#   1. the real-size architecture on random weights, FP16 export (gqa, selection in the graph, 4,096-token cache),
#      fused for CUDA with the default passes and with --vision-gemms, each made into native-step artifacts
#      (FP16 weights; 8-bit weights and embedding)
#   2. the host part on this machine's CPU: the eval page decoded by Pillow (+ its copy out as a numpy array) and
#      by simplejpeg, and the ink check (scripts/host_decode_bench.py)
#   3. with SESSION_MEMORY=1: the vision session alone at load, per graph optimization level, both FP16 fusions
#      (scripts/gpu_vision_session_memory.py)
#   4. scripts/gpu_perf.py memory after 4 pages of 256 tokens under each of MEMORY (form:setting)
#   5. `edgeocr bench` (first token: medians of 7 one-token calls) under each of BENCH (form:setting), twice,
#      alternating
#   6. scripts/gpu_profile.py of each form in PROFILE (CUDA kernels per stage, each stage's kernels in launch order)
#   7. scripts/gpu_profile.py --admission 10 of each form in ADMISSION: one-token calls on the GPU's timeline, what
#      the host adds to the first token from pixels
# HOST=0 skips step 2.  Setting fpa: ORT_FPA_INTB_GEMM=1 (ONNX Runtime's CUTLASS fpA_intB GEMM for the MatMulNBits
# nodes it accepts: 8-bit, blocks of 32, N and K multiples of 32).
# Forms: float / int8 = the default fusion's native-step artifacts (scripts/gpu_realsize.sh), gfloat / gint8 = those of
# the --vision-gemms fusion.  Since `quantize native-step` applies the vision GEMM passes to 8-bit vision weights
# (2026-12-06), int8 and gint8 both have them; int8's q, k, v feed MultiHeadAttention packed (its default for a CUDA
# fusion, 2026-12-07), gint8's as three MatMuls (the fusion applied them); the first runs measured int8 without them.
# f16v8 = FP16 decoder weights with 8-bit vision weights (native-step --weights float --vision int8), built when a list
# names it.
# Steps that would end past DEADLINE seconds (default 560) are skipped and logged.  Everything lands in
# $OUT/results.tar.gz.
set -uo pipefail
# shellcheck source=scripts/gpu_call_common.sh
source "$(dirname "$0")/gpu_call_common.sh" /tmp/work
# shellcheck source=scripts/gpu_realsize.sh
source "$(dirname "$0")/gpu_realsize.sh"
DEADLINE=${DEADLINE:-560}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }

say "-- real-size FP16 export, fused for CUDA (default passes and --vision-gemms), native step"
realsize_native_forms >> "$R/run.log" 2>&1 || { say "build failed"; exit 1; }
G=$W/slots1-fused-gemms
if [ -n "${GEMM_FORMS-float}" ] && [ ! -f "$G/manifest.json" ]; then
  run fuse_vision_gemms 300 $PY -m quantize fuse "$W/slots1" "$G" --target cuda --vision-gemms || exit 1
fi
for form in ${GEMM_FORMS-float}; do
  [ -f "$G-native-$form/manifest.json" ] || run "native_gemms_$form" 300 $PY -m quantize native-step "$G" \
    "$G-native-$form" --weights "$form" || exit 1
done
if [[ " ${MEMORY-} ${BENCH-} ${PROFILE-} ${ADMISSION-} " == *" f16v8"* ]] && [ ! -f "$F-native-f16v8/manifest.json" ]; then
  run native_f16v8 300 $PY -m quantize native-step "$F" "$F-native-f16v8" --weights float --vision int8 || exit 1
fi
[ "${HOST:-1}" = 1 ] && run host_decode 60 $PY scripts/host_decode_bench.py "$IMG" --repeats 30 --json "$R/host_decode.json"
[ "${SESSION_MEMORY:-0}" = 1 ] && run vision_session_memory 150 $PY scripts/gpu_vision_session_memory.py \
  "$F-native-float" "$G-native-float" --levels "${SESSION_LEVELS:-all,disabled}" --json "$R/vision_session_memory.json"

PAGES=("$ROOT"/calibration_data/eval/00000[0-3].jpg)
declare -A ART=([float]="$F-native-float" [int8]="$F-native-int8" [gfloat]="$G-native-float"
                [gint8]="$G-native-int8" [f16v8]="$F-native-f16v8")
declare -A SET=([base]="" [init]="" [nopat]="EDGEOCR_MEM_PATTERN=0" [vg]="EDGEOCR_VISION_GRAPH=1"
                [novg]="EDGEOCR_VISION_GRAPH=0" [vgnopat]="EDGEOCR_VISION_GRAPH=1 EDGEOCR_MEM_PATTERN=0"
                [vgpat]="EDGEOCR_VISION_GRAPH=1 EDGEOCR_MEM_PATTERN=1" [pil]="EDGEOCR_JPEG=pillow"
                [fpa]="ORT_FPA_INTB_GEMM=1")
for spec in ${MEMORY-float:base gfloat:base gfloat:init gfloat:nopat float:vgnopat int8:vgnopat}; do
  IFS=: read -r form set <<< "$spec"
  [ "$(left)" -gt 30 ] || { say "skipped memory_${form}_$set (deadline)"; continue; }
  config=runtime; [ "$set" = init ] && config=initializers
  # shellcheck disable=SC2086
  run "memory_${form}_$set" 60 env EDGEOCR_NATIVE_STEP=1 ${SET[$set]} $PY scripts/gpu_perf.py memory "${ART[$form]}" \
    --config $config --device cuda --tokens 256 --pages 4 --image "${PAGES[@]}" --json "$R/memory_${form}_$set.json"
done
for k in 1 2; do
  for spec in ${BENCH-float:base float:vgnopat gfloat:base}; do
    IFS=: read -r form set <<< "$spec"
    [ "$(left)" -gt 35 ] || { say "skipped bench_${form}_${set}_$k (deadline)"; continue; }
    # shellcheck disable=SC2086
    run "bench_${form}_${set}_$k" 60 env EDGEOCR_NATIVE_STEP=1 ${SET[$set]} $PY -m edgeocr bench "${ART[$form]}" \
      --device cuda --tokens 64 --repeats 1 --image "$IMG" --json "$R/bench_${form}_${set}_$k.json"
  done
done
for form in ${PROFILE-}; do
  [ "$(left)" -gt 40 ] || { say "skipped profile_$form (deadline)"; continue; }
  run "profile_$form" 90 $PY scripts/gpu_profile.py "${ART[$form]}" --steps 16 --sequence 700 --label "$form" \
    --json "$R/profile_$form.json"
done
for form in ${ADMISSION-}; do
  [ "$(left)" -gt 60 ] || { say "skipped admission_$form (deadline)"; continue; }
  run "admission_$form" 90 $PY scripts/gpu_profile.py "${ART[$form]}" --admission 10 --image "$IMG" --label "$form" \
    --json "$R/admission_$form.json"
done
