#!/usr/bin/env bash
# On the GPU test machine: train the demo model (issue 8) in invocations of at most BUDGET_S seconds
# (the machine's commands are time-limited); the first sizes the run to GPU_SECONDS of training, later
# ones (RESUME=1) continue it from /tmp/train.  The machine has no fonts and no package registry: make a
# flat font folder here with `python -m quantize.docgen --subset-fonts .carry/fonts` and carry it.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 EDGEOCR_FONT_DIR=$PWD/.carry/fonts
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
extra=(--gpu-seconds "${GPU_SECONDS:-840}")
[ "${RESUME:-0}" = 1 ] && extra=(--resume)
python3 -m quantize.train /tmp/train "${extra[@]}" --budget-s "${BUDGET_S:-520}" --batch "${BATCH:-32}" \
  --workers 15 --eval-every 0 --device cuda ${EXTRA:-} 2>&1 | grep -v "Writing model shards" | tee -a "$OUT/train.log"
cp /tmp/train/train_log.jsonl /tmp/train/train_config.json "$OUT/" 2>/dev/null
tar -C /tmp/train -czf "$OUT/checkpoint.tgz" checkpoint 2>/dev/null
ls -la "$OUT"
