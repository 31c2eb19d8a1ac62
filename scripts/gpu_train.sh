#!/usr/bin/env bash
# On the GPU test machine: train the demo model (issue 8) for GPU_SECONDS of training on a time schedule
# (learning-rate decay and curriculum follow the seconds trained, so it ends on time).  Logs and the
# checkpoint go to TRAIN_OUT (default /tmp/trainout).  Commands there are time-limited: start it detached
#   setsid nohup bash scripts/gpu_train.sh >/tmp/train.out 2>&1 </dev/null &
# and collect TRAIN_OUT later, or run it in the foreground with BUDGET_S and RESUME=1 for the next part.
# The lent machine goes back 30 s after its last call ends, detached runs and all: keep a call running
# (`sleep 560; tail -1 /tmp/train.out`, then another) until TRAINING FINISHED.  The defaults are the
# shipped demo model's recipe (800 s, glyph loss 0.5, 20 % reading pages, each page used twice).
# The machine has no fonts and no package registry: make a flat font folder here with
# `python -m quantize.docgen --subset-fonts .carry/fonts` and carry it.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 EDGEOCR_FONT_DIR=$PWD/.carry/fonts
T=${TRAIN_OUT:-/tmp/trainout}; mkdir -p "$T"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$T/train.log"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
extra=(--gpu-seconds "${GPU_SECONDS:-800}" --tokenizer demo_model/tokenizer.json)
[ "${RESUME:-0}" = 1 ] && extra=(--resume)
python3 -m quantize.train /tmp/train "${extra[@]}" --budget-s "${BUDGET_S:-100000}" --batch "${BATCH:-32}" \
  --workers 15 --eval-every 0 --device cuda ${EXTRA---glyph-loss 0.5 --reading-frac 0.2 --reuse 2} 2>&1 | grep --line-buffered -v "Writing model shards" \
  | tee -a "$T/train.log"
cp /tmp/train/train_log.jsonl /tmp/train/train_config.json "$T/" 2>/dev/null
tar -C /tmp/train -czf "$T/checkpoint.tgz" checkpoint 2>/dev/null
echo "TRAINING FINISHED" >> "$T/train.log"
