#!/usr/bin/env bash
# On the GPU test machine: train the demo model (issue 8).  The machine has no fonts and no package
# registry: carry a flat font folder (copy from this machine: wqy-microhei.ttc and the Liberation
# .ttf files) as .carry/fonts and name it in the run's `carry`.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 EDGEOCR_FONT_DIR=$PWD/.carry/fonts
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m quantize.docgen --fonts --out /tmp/x 2>&1 | head -2
timeout ${BUDGET_S:-540} python3 -m quantize.train /tmp/train --steps ${STEPS:-2500} --batch ${BATCH:-24} \
  --workers 15 --device cuda 2>&1 | tail -40 | tee "$OUT/train.log"
cp /tmp/train/train_log.jsonl "$OUT/" 2>/dev/null
tar -C /tmp/train -czf "$OUT/checkpoint.tgz" checkpoint 2>/dev/null
