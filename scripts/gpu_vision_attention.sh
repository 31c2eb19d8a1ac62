#!/usr/bin/env bash
# On the GPU machine (CUDA torch and onnxruntime-gpu importable; SITE=/tmp/site is put first on PYTHONPATH if it
# exists), one call of ~5 min: which attention kernel ONNX Runtime's MultiHeadAttention runs for the vision graph,
# and whether device memory keeps growing page after page.
#   1. the real-size architecture on random weights, FP16 export fused for CUDA and its native-step form with FP16
#      weights, as scripts/gpu_memory.sh builds them ($W, reused when there)
#   2. `edgeocr bench` of the native FP16 artifact (first token: median of 7 calls, with vision and prefill) with
#      ONNX Runtime's default attention kernel choice (flash attention), with flash attention off (cutlass memory-
#      efficient attention), with cuDNN's fused attention alone (ORT_ENABLE_CUDNN_FLASH_ATTENTION and the others
#      off), and with the vision arena kept between calls; the vision graph's output under each against the
#      default's (scripts/vision_kernels_agree.py)
#   3. scripts/gpu_perf.py memory of the native FP16 artifact over 6 different eval pages of 256 tokens
# Everything lands in $OUT/results.tar.gz.
set -uo pipefail
# shellcheck source=scripts/gpu_call_common.sh
source "$(dirname "$0")/gpu_call_common.sh" /tmp/work
# shellcheck source=scripts/gpu_realsize.sh
source "$(dirname "$0")/gpu_realsize.sh"

say "-- real-size FP16 export, fused for CUDA, native step"
realsize_slots 1 >> "$R/run.log" 2>&1 || { say "build failed"; exit 1; }
F=$SLOTS_ART
NATIVE=float realsize_slots 1 >> "$R/run.log" 2>&1 || { say "native-step failed"; exit 1; }
N=$SLOTS_ART

OFF="ORT_DISABLE_FLASH_ATTENTION=1 ORT_DISABLE_MEMORY_EFFICIENT_ATTENTION=1 ORT_DISABLE_TRT_FLASH_ATTENTION=1"
OFF="$OFF ORT_DISABLE_FUSED_ATTENTION=1"
declare -A KERNELS=(
  [default]=""
  [efficient]="ORT_DISABLE_FLASH_ATTENTION=1"
  [cudnn]="$OFF ORT_ENABLE_CUDNN_FLASH_ATTENTION=1"
  [keep_arena]="EDGEOCR_VISION_ARENA=keep"
)
for name in default efficient cudnn keep_arena; do
  # shellcheck disable=SC2086
  run "bench_$name" 90 env EDGEOCR_NATIVE_STEP=1 ${KERNELS[$name]} $PY -m edgeocr bench "$N" --device cuda \
    --tokens 64 --repeats 2 --cuda-graph on --image "$IMG" --json "$R/bench_$name.json"
done
PAGES=$(ls "$ROOT"/calibration_data/eval/*.jpg | head -6)
for art in native-float; do
  # shellcheck disable=SC2086
  [ -d "$F-$art" ] && run "memory6_$art" 150 env EDGEOCR_NATIVE_STEP=1 $PY scripts/gpu_perf.py memory "$F-$art" \
    --config runtime --device cuda --tokens 256 --pages 6 --image $PAGES --json "$R/memory6_$art.json"
done
for name in efficient cudnn; do
  # shellcheck disable=SC2086
  run "agree_$name" 90 $PY scripts/vision_kernels_agree.py "$N" "$IMG" "$R/agree_$name.json" ${KERNELS[$name]}
done

