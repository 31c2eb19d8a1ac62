# Sourced by the GPU bench scripts (gpu_slots_bench.sh, gpu_ray_bench.sh): realsize_slots N builds, once per work
# folder $W, the real-size architecture on random weights ($W/real-ckpt), its FP16 export with GroupQueryAttention
# and in-graph selection ($W/real-fp16-gqa), that export with N slots ($W/slotsN) and, with FUSE=1 (the default),
# those graphs fused for CUDA ($W/slotsN-fused, `python -m quantize fuse`: the flavour the README recommends on
# GPUs); it sets SLOTS_ART to the artifact to bench and returns non-zero (the failed step's last lines printed) if
# a step fails.  $PY: the Python to run (default python3).  FUSE=0 benches the unfused export, as before
# 2026-12-05.  NATIVE=float or NATIVE=int8 benches that artifact's `python -m quantize native-step` form
# ($W/slotsN[-fused]-native-float|int8: edgeocr's own CUDA decode step, at most 8 slots; int8: 8-bit weights and
# embedding, the default of --weights int8).
_last_line() {   # command...: run it, print its last line of output; on failure its last 10 lines and fail
  local out
  out=$("$@" 2>&1) || { printf '%s\n' "$out" | tail -10; return 1; }
  printf '%s\n' "$out" | tail -1
}
realsize_slots() {
  local n=$1 py=${PY:-python3}
  [ -d "$W/real-ckpt" ] || _last_line $py -m quantize.realsize "$W/real-ckpt" || return 1
  [ -f "$W/real-fp16-gqa/manifest.json" ] || _last_line $py -m quantize export "$W/real-ckpt" "$W/real-fp16-gqa" \
      --precision fp16 --device cuda --attention gqa --select-on-device --cache-len 4096 || return 1
  [ -f "$W/slots$n/manifest.json" ] || _last_line $py -m quantize reslot "$W/real-fp16-gqa" "$W/slots$n" \
      --slots "$n" || return 1
  SLOTS_ART=$W/slots$n
  case ${FUSE:-1} in 0|1) ;; *) echo "FUSE must be 0 or 1, not '$FUSE'"; return 1;; esac
  if [ "${FUSE:-1}" = 1 ]; then
    [ -f "$W/slots$n-fused/manifest.json" ] || _last_line $py -m quantize fuse "$W/slots$n" "$W/slots$n-fused" \
        --target cuda || return 1
    SLOTS_ART=$W/slots$n-fused
  fi
  case ${NATIVE:-0} in 0|float|int8) ;; *) echo "NATIVE must be 0, float or int8, not '$NATIVE'"; return 1;; esac
  if [ "${NATIVE:-0}" != 0 ]; then
    [ -f "$SLOTS_ART-native-$NATIVE/manifest.json" ] || _last_line $py -m quantize native-step "$SLOTS_ART" \
        "$SLOTS_ART-native-$NATIVE" --weights "$NATIVE" || return 1
    SLOTS_ART=$SLOTS_ART-native-$NATIVE
  fi
}
# realsize_native_forms: the one-slot fused artifact's two native-step forms, FP16 weights ($W/slots1-fused-native-float)
# and 8-bit weights and embedding ($W/slots1-fused-native-int8); sets F=$W/slots1-fused (what gpu_arena.sh and
# gpu_graphs.sh measure).
realsize_native_forms() {
  NATIVE=float realsize_slots 1 || return 1
  F=$W/slots1-fused
  [ -f "$F-native-int8/manifest.json" ] || _last_line ${PY:-python3} -m quantize native-step "$F" "$F-native-int8" \
      --weights int8 || return 1
}
