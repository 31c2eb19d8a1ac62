#!/usr/bin/env bash
# On the GPU machine: continue the demo model from demo_model/ for GPU_SECONDS of training on a time
# schedule (learning-rate decay follows the seconds trained, so the run ends on time), in invocations of at
# most BUDGET_S seconds each, for machines whose commands are time-limited:
#   bash scripts/gpu_train.sh            # first call: renders the page pool, starts training
#   bash scripts/gpu_train.sh            # later calls: load the cached pool, resume; repeat until FINISHED
# The run lives in RUN (default /tmp/edgeocr-train; it survives between calls while the machine is held).
# Each call copies the checkpoint (bf16 once finished), run_summary.json (recipe, seconds, page views,
# page views/s, mean GPU busy %), train_log.jsonl and the console log to $OUT (default RUN/out).
# Env: GPU_SECONDS (800), BUDGET_S (540), BATCH (32), POOL_PAGES (8192), PAGES_DIRS (space-separated folders
# of labelled pages, calibration_data format), COMPILE=1 (torch.compile the forward), EXTRA (more flags),
# FRESH=1 (random weights instead of --init demo_model).
# The machine has no fonts: make a flat font folder here with
# `python -m quantize.docgen --subset-fonts .carry/fonts` and carry it.
set -euo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 EDGEOCR_FONT_DIR=${EDGEOCR_FONT_DIR:-$PWD/.carry/fonts}
RUN=${RUN:-/tmp/edgeocr-train}
OUT=${OUT:-$RUN/out}
mkdir -p "$RUN" "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/train.log"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  | tee -a "$OUT/train.log"
args=(--gpu-seconds "${GPU_SECONDS:-800}" --budget-s "${BUDGET_S:-540}" --batch "${BATCH:-32}"
      --pool-pages "${POOL_PAGES:-8192}" --eval-every 0 --device cuda)
if [ -f "$RUN/train_state.pt" ]; then
  args+=(--resume)
elif [ "${FRESH:-0}" = 1 ]; then
  args+=(--tokenizer demo_model/tokenizer.json)
else
  args+=(--init demo_model)
fi
for d in ${PAGES_DIRS:-}; do args+=(--pages "$d"); done
[ "${COMPILE:-0}" = 1 ] && args+=(--compile)
# shellcheck disable=SC2086
python3 -m quantize.train "$RUN" "${args[@]}" ${EXTRA:-} 2>&1 | grep --line-buffered -v "Writing model shards" \
  | tee -a "$OUT/train.log"
cp "$RUN"/run_summary.json "$RUN"/train_log.jsonl "$RUN"/train_config.json "$OUT/" 2>/dev/null || true
rm -rf "$OUT/checkpoint" && cp -r "$RUN/checkpoint" "$OUT/checkpoint"
if python3 -c "import json,sys; sys.exit(0 if json.load(open('$RUN/run_summary.json'))['total']['finished'] else 1)"; then
  echo "TRAINING FINISHED" | tee -a "$OUT/train.log"
else
  echo "TRAINING CONTINUES: run scripts/gpu_train.sh again" | tee -a "$OUT/train.log"
fi
