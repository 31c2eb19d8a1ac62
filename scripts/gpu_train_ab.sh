#!/usr/bin/env bash
# On the GPU machine: one controlled training question, several variants side by side on one GPU.
# The page pool is rendered once and shared; the variants then train concurrently for the same seconds on the
# same pages (each gets its share of the GPU), and each finished checkpoint is measured the same way:
# scripts/diag_image_use.py (teacher-forced loss and accuracy with the page's own image, a blank page and
# another page's image, on business documents and on reading pages of levels 0, 0.5 and 1) and
# scripts/eval_ckpt.py (greedy full-text CER on the first EVAL_PAGES calibration_data/eval pages).
#   VARIANTS='ctrl|--init demo_model
#   qk2|--init demo_model --qk-gain 2 --qk-gain-lr 10' bash scripts/gpu_train_ab.sh
# Each variant line is NAME|FLAGS (flags of python -m quantize.train). Common flags go in COMMON.
# Env: DEVICE (cuda), DIAG_PAGES (8), SECONDS_EACH (330, training seconds per variant, on a time schedule), POOL_PAGES (3072), BATCH (32),
# COMMON (extra flags for every variant), EVAL_PAGES (8), RUN (/tmp/edgeocr-ab), OUT ($RUN/out).
# Results in $OUT: NAME.tar.gz (bf16 checkpoint, train_log.jsonl, run_summary.json, train_config.json,
# diag.json, eval.json) and ab.log. The machine has no fonts: carry a folder made here with
# `python -m quantize.docgen --subset-fonts .carry/fonts`.
set -euo pipefail
RUN_DEFAULT=/tmp/edgeocr-ab LOG_NAME=ab.log
# shellcheck source=scripts/gpu_run_common.sh
source "$(dirname "$0")/gpu_run_common.sh"
pool_flags=(--pool-pages "${POOL_PAGES:-3072}" --batch "${BATCH:-32}" --pool-cache "$RUN/pool" --eval-every 0
            --device "${DEVICE:-cuda}")
read -r -a common <<<"${COMMON:-}"
say "rendering the shared page pool"
python3 -m quantize.train "$RUN/pool-only" --init demo_model --budget-s 0 "${pool_flags[@]}" "${common[@]}" \
  2>&1 | grep -v "Writing model shards" | tee -a "$LOG" | grep -E "pool|error|Error" || true
names=()
while IFS='|' read -r name flags; do
  [ -z "$name" ] && continue
  names+=("$name")
  read -r -a f <<<"$flags"
  say "variant $name: $flags ${COMMON:-}"
  python3 -m quantize.train "$RUN/$name" --gpu-seconds "${SECONDS_EACH:-330}" "${pool_flags[@]}" "${f[@]}" \
    "${common[@]}" >"$RUN/$name.log" 2>&1 &
done <<<"${VARIANTS:?set VARIANTS, one NAME|FLAGS per line}"
wait
for n in "${names[@]}"; do
  grep -E "step .*(loss|done)|multiply|norm weights|resumed|Error|error" "$RUN/$n.log" | tail -4 | sed "s/^/$n: /" \
    | tee -a "$LOG"
done
say "measuring the checkpoints"
for n in "${names[@]}"; do
  ( python3 scripts/diag_image_use.py "$RUN/$n/checkpoint" --device "${DEVICE:-cuda}" --pages "${DIAG_PAGES:-8}" --levels 0,0.5,1 \
      --json "$RUN/$n/diag.json" >"$RUN/$n.diag.log" 2>&1
    python3 scripts/eval_ckpt.py "$RUN/$n/checkpoint" --device "${DEVICE:-cuda}" --pages "${EVAL_PAGES:-8}" \
      --json "$RUN/$n/eval.json" >"$RUN/$n.eval.log" 2>&1 ) &
done
wait
for n in "${names[@]}"; do
  grep -vE "Loading|Writing" "$RUN/$n.diag.log" "$RUN/$n.eval.log" | sed "s/^/$n: /" | tee -a "$LOG"
  (cd "$RUN/$n" && cp "$RUN/$n.log" train.log && tar czf "$OUT/$n.tar.gz" checkpoint train_log.jsonl \
     run_summary.json train_config.json diag.json eval.json train.log 2>/dev/null) || say "$n: incomplete"
done
say "done"
