# Sourced by the GPU bench scripts (gpu_slots_bench.sh, gpu_ray_bench.sh): realsize_slots N builds, once per work
# folder $W, the real-size architecture on random weights ($W/real-ckpt), its FP16 export with GroupQueryAttention
# and in-graph selection ($W/real-fp16-gqa) and that export with N slots ($W/slotsN), and returns non-zero (the
# failed step's last lines printed) if a step fails.  $PY: the Python to run (default python3).
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
}
