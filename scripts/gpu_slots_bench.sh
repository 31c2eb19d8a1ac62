#!/usr/bin/env bash
# Many pages at once on an NVIDIA GPU (onnxruntime-gpu importable; CUDA torch + transformers for the peer):
# the real-size architecture on random weights, one FP16 export with GroupQueryAttention and in-graph
# selection (CUDA graph on), the same graphs with 1, 4, 8 and 16 slots (`python -m quantize reslot`; the
# decoder graph takes any batch), fused for CUDA unless FUSE=0 (scripts/gpu_realsize.sh), PAGES distinct 1024x1024 pages x TOKENS new tokens each through
# `edgeocr bench --pages` (each page's vision ahead on a worker thread; 8 slots also with vision ahead
# off, with vision ahead on prioritized CUDA streams: EDGEOCR_STREAM_PRIORITIES=1, and with each page's prefill
# beside the step too, EDGEOCR_PREFILL_BESIDE=1, with and without the priorities), against transformers'
# batched generate (bf16, sdpa) at the same batch sizes on 2 x batch pages (at least 4; PEER=0: no
# transformers, `edgeocr bench` alone, a one-slot run without vision ahead; NATIVE=float|int8: the artifacts'
# native-step form, scripts/gpu_realsize.sh; BESIDE=0: 8 slots with vision ahead and with the vision in line only).
# JSON and a log under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; W=${W:-/tmp/work}; mkdir -p "$OUT" $W
PAGES=${PAGES:-64}; TOKENS=${TOKENS:-256}; SLOTS=${SLOTS:-1 4 8 16}
# shellcheck source=scripts/gpu_realsize.sh
source "$(dirname "$0")/gpu_realsize.sh"
bench() {   # JSON-NAME edgeocr-bench-flags...
  local name=$1; shift
  python3 -m edgeocr bench "$SLOTS_ART" --device cuda --pages $PAGES --tokens $TOKENS --task structured_parse \
      "$@" --json "$OUT/$name.json" 2>&1 | tee -a "$OUT/slots_bench.log"
}
for n in $SLOTS; do
  realsize_slots "$n" || exit 1
  tp=$(( 2 * n < 4 ? 4 : 2 * n ))
  if [ "${PEER:-1}" = 0 ]; then
    if [ "$n" = 1 ]; then bench slots_1 --vision-ahead off; else bench "slots_$n" --vision-ahead on; fi
    continue
  fi
  python3 -m quantize bench-hf "$SLOTS_ART" $W/real-ckpt --device cuda --pages $PAGES --tokens $TOKENS \
      --task structured_parse --transformers-pages $tp --vision-ahead on --json "$OUT/slots_$n.json" 2>&1 \
      | grep -v "Loading weights" | tee -a "$OUT/slots_bench.log"
done
# the same 8 slots with every page's vision run while the other slots wait (vision ahead off), same run
if [[ " $SLOTS " == *" 8 "* ]]; then
  realsize_slots 8 || exit 1
  if [ "${BESIDE:-1}" = 1 ]; then
    EDGEOCR_PREFILL_BESIDE=1 EDGEOCR_STREAM_PRIORITIES=1 bench slots_8_prefill_beside_priorities --vision-ahead on
    EDGEOCR_PREFILL_BESIDE=1 bench slots_8_prefill_beside --vision-ahead on
    EDGEOCR_STREAM_PRIORITIES=1 bench slots_8_stream_priorities --vision-ahead on
  fi
  bench slots_8_vision_waits --vision-ahead off
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/slots_bench.log"
