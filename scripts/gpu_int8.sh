#!/usr/bin/env bash
# On a CUDA machine: real-size INT8 artifact (NNCF on the machine's 16 CPU cores) -> sizes, time.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=/tmp/work; mkdir -p $W
[ -d $W/real-ckpt ] || python3 -m quantize.realsize $W/real-ckpt 2>&1 | tail -1
/usr/bin/time -f "int8 build wall %e s, peak RSS %M KiB" python3 -m quantize int8 $W/real-ckpt $W/real-int8 \
  --calib calibration_data/calib --calib-images ${CALIB:-8} --holdout-images ${HOLD:-2} --device cuda \
  ${NOSENS:---no-sensitivity} > "$OUT/int8_build.log" 2>&1; grep -v "━" "$OUT/int8_build.log" | tail -25
python3 -c "
import json; m=json.load(open('$W/real-int8/manifest.json'))
print(json.dumps({k: {kk: v[kk] for kk in ('metric','score','gate','gate_passed','quantized','eligible')} for k, v in m['export']['int8']['graphs'].items()}, indent=1))
" | tee -a "$OUT/int8_build.log"
