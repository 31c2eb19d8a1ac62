#!/usr/bin/env bash
# On a CUDA machine (CUDA torch + transformers preinstalled, TensorRT-RTX in /tmp/site):
# the real-size architecture on random weights, its FP16 export with the portable decoder (the one
# TensorRT takes), and `edgeocr build --flavour tensorrt_rtx` of it.  TensorRT-RTX does not run engines
# on the H200 (compute capability 9.0); if the builder refuses the GPU too, the build is repeated ahead of
# time with the GPU hidden.  engines.json and the logs go to $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=/tmp/work; mkdir -p $W
[ -d $W/real-ckpt ] || python3 -m quantize.realsize $W/real-ckpt 2>&1 | tail -1
[ -f $W/real-fp16/manifest.json ] || /usr/bin/time -f "export wall %e s" python3 -m quantize export $W/real-ckpt \
    $W/real-fp16 --precision fp16 --device cuda --cache-len 4096 2>&1 | tail -3 | tee "$OUT/trt_export.log"
du -sh $W/real-fp16 | tee -a "$OUT/trt_export.log"
b() { /usr/bin/time -f "build wall %e s, peak RSS %M KB" python3 -m edgeocr build $W/real-fp16 --flavour tensorrt_rtx "$@"; }
if b > "$OUT/trt_build.log" 2>&1; then
  echo "built with the GPU visible" >> "$OUT/trt_build.log"
else
  echo "== the build with the GPU visible failed (above); again ahead of time, GPU hidden ==" >> "$OUT/trt_build.log"
  CUDA_VISIBLE_DEVICES= b >> "$OUT/trt_build.log" 2>&1
fi
cp $W/real-fp16/engines.json "$OUT/engines_real_fp16.json" 2>/dev/null
ls -la $W/real-fp16 >> "$OUT/trt_build.log"
tail -25 "$OUT/trt_build.log"
