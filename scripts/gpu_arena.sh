#!/usr/bin/env bash
# On the GPU machine (CUDA torch, transformers and onnxruntime-gpu importable; SITE=/tmp/site is put first on
# PYTHONPATH if it exists): device memory and first token of the native-step artifacts under the CUDA arena
# settings of edgeocr.ort_options, in about 3 minutes on an H100.
#   1. the real-size architecture on random weights, FP16 export (gqa, selection in the graph, 4,096-token cache),
#      fused for CUDA, and its native-step forms with FP16 weights and with 8-bit weights and embedding
#   2. scripts/gpu_perf.py memory after 4 pages of 256 tokens (eval pages 0-3; each page's vision and prefill
#      times are in its JSON) for every combination of EDGEOCR_CUDA_ARENA (separate | shared),
#      EDGEOCR_VISION_ARENA (shrink | keep) and EDGEOCR_MEM_PATTERN (1 | 0) on the FP16 form, four on the 8-bit one
#   3. `edgeocr bench` (first token medians, decode) of the FP16 form under four of them
# FLOAT_SETTINGS, INT8_SETTINGS and BENCH_SETTINGS (space-separated setting names, below) replace the lists of 2 and 3;
# an empty one skips its step.
# Everything lands in $OUT/results.tar.gz.
set -uo pipefail
# shellcheck source=scripts/gpu_call_common.sh
source "$(dirname "$0")/gpu_call_common.sh" /tmp/work
# shellcheck source=scripts/gpu_realsize.sh
source "$(dirname "$0")/gpu_realsize.sh"

say "-- real-size FP16 export, fused for CUDA, native step"
realsize_native_forms >> "$R/run.log" 2>&1 || { say "build failed"; exit 1; }
PAGES=("$ROOT"/calibration_data/eval/00000[0-3].jpg)
[ "${#PAGES[@]}" = 4 ] && [ -f "${PAGES[3]}" ] || { say "eval pages 000000-000003.jpg not found"; exit 1; }

# setting name -> "CUDA_ARENA VISION_ARENA MEM_PATTERN"
declare -A SET=([sep_shrink]="separate shrink 1" [sep_shrink_nopat]="separate shrink 0"
                [sep_keep]="separate keep 1" [sep_keep_nopat]="separate keep 0"
                [shr_shrink]="shared shrink 1" [shr_shrink_nopat]="shared shrink 0"
                [shr_keep]="shared keep 1" [shr_keep_nopat]="shared keep 0")
envs() { local a v p; [[ -v SET[$1] ]] || { echo "no setting '$1'" >&2; exit 1; }
  read -r a v p <<<"${SET[$1]}"; echo "EDGEOCR_CUDA_ARENA=$a EDGEOCR_VISION_ARENA=$v EDGEOCR_MEM_PATTERN=$p"; }
for s in "${!SET[@]}" ${FLOAT_SETTINGS:-} ${INT8_SETTINGS:-} ${BENCH_SETTINGS:-}; do envs "$s" > /dev/null || exit 1; done

memory() { local form=$1 art=$2 set=$3
  # shellcheck disable=SC2046
  run "memory_${form}_$set" 90 env EDGEOCR_NATIVE_STEP=1 $(envs "$set") $PY scripts/gpu_perf.py memory "$art" \
    --config runtime --device cuda --tokens 256 --pages 4 --image "${PAGES[@]}" --json "$R/memory_${form}_$set.json"; }
for s in ${FLOAT_SETTINGS-sep_shrink sep_shrink_nopat sep_keep sep_keep_nopat shr_shrink shr_shrink_nopat shr_keep shr_keep_nopat}; do
  memory float "$F-native-float" $s
done
for s in ${INT8_SETTINGS-sep_shrink sep_keep_nopat shr_keep shr_keep_nopat}; do
  memory int8 "$F-native-int8" $s
done
for s in ${BENCH_SETTINGS-sep_shrink sep_keep shr_keep shr_keep_nopat}; do
  # shellcheck disable=SC2046
  run "bench_float_$s" 90 env EDGEOCR_NATIVE_STEP=1 $(envs "$s") $PY -m edgeocr bench "$F-native-float" \
    --device cuda --tokens 256 --repeats 2 --image "$IMG" --json "$R/bench_float_$s.json"
done
