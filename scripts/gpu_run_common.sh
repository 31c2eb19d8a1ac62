# Sourced by the GPU training scripts (gpu_train_ab.sh, gpu_curriculum.sh) after `set -euo pipefail`:
# the environment, the run folder RUN (default RUN_DEFAULT) with its results in OUT, the log OUT/LOG_NAME,
# say() to print and log a timestamped line, and the GPU's name at the top of the log.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 EDGEOCR_FONT_DIR=${EDGEOCR_FONT_DIR:-$PWD/.carry/fonts}
RUN=${RUN:-$RUN_DEFAULT}
OUT=${OUT:-$RUN/out}
mkdir -p "$RUN" "$OUT"
LOG=$OUT/$LOG_NAME
say() { echo "[$(date +%T)] $*" | tee -a "$LOG"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true; } | tee -a "$LOG"
