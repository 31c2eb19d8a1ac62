#!/usr/bin/env bash
# On the GPU machine (CUDA torch, transformers and onnxruntime-gpu importable; SITE=/tmp/site is put first on
# PYTHONPATH if it exists): the first token and device memory of the native-step artifacts with the prefill and
# the vision graph replayed as CUDA graphs (EDGEOCR_PREFILL_GRAPH, EDGEOCR_VISION_GRAPH) and with a smaller
# per-thread stack reserved by the CUDA context (EDGEOCR_CUDA_STACK), against the runtime's defaults.
#   1. the real-size architecture on random weights, FP16 export (gqa, selection in the graph, 4,096-token cache),
#      fused for CUDA, and its native-step forms with FP16 weights and with 8-bit weights and embedding
#   2. `edgeocr bench` (first token medians of 7 one-token calls, decode) of the FP16 form under each setting of
#      BENCH_SETTINGS
#   3. scripts/gpu_perf.py memory after 4 pages of 256 tokens (eval pages 0-3) under each setting of
#      FLOAT_SETTINGS (FP16 form) and INT8_SETTINGS (8-bit form)
# Settings are names from the table below; an empty list skips its step.  BUILD_ONLY=1 stops after step 1 (the
# artifacts stay in /tmp/work for the next call on the same machine).  Everything lands in $OUT/results.tar.gz.
set -uo pipefail
# shellcheck source=scripts/gpu_call_common.sh
source "$(dirname "$0")/gpu_call_common.sh" /tmp/work
# shellcheck source=scripts/gpu_realsize.sh
source "$(dirname "$0")/gpu_realsize.sh"

say "-- real-size FP16 export, fused for CUDA, native step"
realsize_native_forms >> "$R/run.log" 2>&1 || { say "build failed"; exit 1; }
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0
PAGES=("$ROOT"/calibration_data/eval/00000[0-3].jpg)
[ "${#PAGES[@]}" = 4 ] && [ -f "${PAGES[3]}" ] || { say "eval pages 000000-000003.jpg not found"; exit 1; }

declare -A SET=([base]="" [drv]="EDGEOCR_CUDA_STACK=driver" [old]="EDGEOCR_CUDA_STACK=driver EDGEOCR_PREFILL_GRAPH=0"
                [pf]="EDGEOCR_PREFILL_GRAPH=1" [vg]="EDGEOCR_VISION_GRAPH=1"
                [pfvg]="EDGEOCR_PREFILL_GRAPH=1 EDGEOCR_VISION_GRAPH=1"
                [st512]="EDGEOCR_CUDA_STACK=512" [st256]="EDGEOCR_CUDA_STACK=256" [st0]="EDGEOCR_CUDA_STACK=0"
                [pf_st256]="EDGEOCR_PREFILL_GRAPH=1 EDGEOCR_CUDA_STACK=256"
                [pfvg_st256]="EDGEOCR_PREFILL_GRAPH=1 EDGEOCR_VISION_GRAPH=1 EDGEOCR_CUDA_STACK=256"
                [st0_shr]="EDGEOCR_CUDA_STACK=0 EDGEOCR_CUDA_ARENA=shared"
                [st0_nopat]="EDGEOCR_CUDA_STACK=0 EDGEOCR_MEM_PATTERN=0"
                [st0_pf]="EDGEOCR_CUDA_STACK=0 EDGEOCR_PREFILL_GRAPH=1"
                [st0_pf_nopat]="EDGEOCR_CUDA_STACK=0 EDGEOCR_PREFILL_GRAPH=1 EDGEOCR_MEM_PATTERN=0"
                [st0_pfvg]="EDGEOCR_CUDA_STACK=0 EDGEOCR_PREFILL_GRAPH=1 EDGEOCR_VISION_GRAPH=1")
for s in ${BENCH_SETTINGS:-} ${FLOAT_SETTINGS:-} ${INT8_SETTINGS:-}; do
  [[ -v SET[$s] ]] || { say "no setting '$s'"; exit 1; }
done
for s in ${BENCH_SETTINGS-base pf pfvg}; do
  # shellcheck disable=SC2086
  run "bench_float_$s" 120 env EDGEOCR_NATIVE_STEP=1 ${SET[$s]} $PY -m edgeocr bench "$F-native-float" \
    --device cuda --tokens 256 --repeats 2 --image "$IMG" --json "$R/bench_float_$s.json"
done
memory() { local form=$1 art=$2 set=$3
  # shellcheck disable=SC2086
  run "memory_${form}_$set" 120 env EDGEOCR_NATIVE_STEP=1 ${SET[$set]} $PY scripts/gpu_perf.py memory "$art" \
    --config runtime --device cuda --tokens 256 --pages 4 --image "${PAGES[@]}" --json "$R/memory_${form}_$set.json"; }
for s in ${FLOAT_SETTINGS-base st256 st0 pf pfvg}; do memory float "$F-native-float" "$s"; done
for s in ${INT8_SETTINGS-base st256}; do memory int8 "$F-native-int8" "$s"; done
