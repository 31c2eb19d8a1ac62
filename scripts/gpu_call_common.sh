# Sourced by the one-call GPU measurement scripts (gpu_letterbox.sh, gpu_memory.sh, gpu_vision_attention.sh,
# gpu_first_token.sh, gpu_vision_qkv.sh, ...) after
# `set -uo pipefail`: the repository root as working directory, PYTHONPATH with SITE (/tmp/site, where the staged
# onnxruntime-gpu wheel is installed) first if it exists, PY, the results folder R (a fresh temporary one, packed
# into $OUT/results.tar.gz on exit), the work folder W (default $1), IMG (an eval page), say() to print and log a
# line with the seconds since start, run NAME LIMIT CMD... to run a step into the log under a time limit, and the
# GPU's name at the top of the log.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SITE=${SITE:-/tmp/site}
export PYTHONPATH=$([ -d "$SITE" ] && echo "$SITE:")$ROOT PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/out}
R=$(mktemp -d)
W=${W:-$1}
mkdir -p "$OUT" "$W"
IMG=$ROOT/calibration_data/eval/000000.jpg
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$R/run.log"; }
run() { local name=$1 limit=$2; shift 2; say "-- $name"; timeout -k 5 "$limit" "$@" >> "$R/run.log" 2>&1
  local rc=$?; [ $rc = 0 ] || say "   $name failed (rc $rc)"; return $rc; }
finish() { say "done"; tar czf "$OUT/results.tar.gz" -C "$R" .; }
trap finish EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$R/run.log"
# the device path's JPEG decoder: without simplejpeg (the [cuda] extra's; stage its wheel beside onnxruntime-gpu) the
# runtime falls back to Pillow and a first token from the file costs 3.4-5.7 ms more (docs/perf.md section 24)
$PY -c "from edgeocr.preprocess import jpeg_decoder as j; print('jpeg decoder:', j())" 2>&1 | tail -1 \
  | tee -a "$R/run.log"
