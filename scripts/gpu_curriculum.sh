#!/usr/bin/env bash
# On the GPU machine: train the demo model through a curriculum of stages in one call, each stage continuing
# the last one's checkpoint on a page pool of its own (rendered in the background while the stage before it
# trains), then measure the result like scripts/gpu_train_ab.sh does (diag_image_use.py on business documents
# and reading pages of levels 0, 0.5 and 1; eval_ckpt.py greedy CER on the first EVAL_PAGES eval pages and the
# first EVAL_HTML_PAGES eval_html pages).
#   STAGES='easy|300|--reading-frac 1.0 --reading-level 0 --data-seed 7100
#   mix|180|--reading-frac 0.5 --reading-level 0:0.5 --data-seed 7200' INIT=demo_model bash scripts/gpu_curriculum.sh
# Each stage line is NAME|SECONDS|FLAGS (flags of python -m quantize.train; give each stage its own
# --data-seed so no page is seen in two stages). INIT: the checkpoint to start from (demo_model, or one carried
# back from an earlier call). Env: POOL_PAGES (6144), BATCH (32), EVAL_PAGES (8), EVAL_HTML_PAGES (8), EVAL_BATCH (8:
# pages per generate call when measuring), DIAG_PAGES (8; 0 skips the diagnosis; EVAL_PAGES and EVAL_HTML_PAGES
# likewise skip their measuring: a call that only trains, measured afterwards on the CPU),
# RUN (/tmp/edgeocr-cur), OUT ($RUN/out), DEADLINE_S (560 s from this script's start: each stage is shortened, or
# skipped, so that the checkpoint is packed and measured before then; RESERVE_S, 150, is what a stage's start, the
# packing and the measuring take; subtract what the call does before the script from DEADLINE_S). Results in $OUT: final.tar.gz (bf16 checkpoint of the last stage,
# every stage's train_log.jsonl, run_summary.json and train_config.json; written before measuring), diag.json (unless
# DIAG_PAGES=0),
# eval.json, eval_html.json and cur.log. Wall time on one H200 with 16 cores: the first pool (about 75 s for 8,192 pages) + the
# stages' seconds + about 30 s of model loads per stage + about 90 s of measuring.
# Carry the tarball's checkpoint/ back (e.g. in .carry/) and give it as INIT to continue in a later call.
# The machine has no fonts: carry a folder made here with `python -m quantize.docgen --subset-fonts .carry/fonts`.
set -euo pipefail
RUN_DEFAULT=/tmp/edgeocr-cur LOG_NAME=cur.log
# shellcheck source=scripts/gpu_run_common.sh
source "$(dirname "$0")/gpu_run_common.sh"
common=(--pool-pages "${POOL_PAGES:-6144}" --batch "${BATCH:-32}" --eval-every 0 --device "${DEVICE:-cuda}")
names=() secs=() flags=()
for v in DIAG_PAGES EVAL_PAGES EVAL_HTML_PAGES; do
  [[ "${!v:-8}" =~ ^[0-9]+$ ]] || { echo "$v must be a whole number, not '${!v}'"; exit 2; }
done
while IFS='|' read -r name s f; do
  [ -z "$name" ] && continue
  [[ "$s" =~ ^[0-9]+$ ]] || { echo "stage $name: SECONDS must be a whole number, not '$s'"; exit 2; }
  names+=("$name") secs+=("$s") flags+=("$f")
done <<<"${STAGES:?set STAGES, one NAME|SECONDS|FLAGS per line}"

# every --pages folder must be here before anything starts (a folder staged by an earlier call is gone when the
# machine was given back in between)
for i in "${!names[@]}"; do
  read -r -a f <<<"${flags[$i]}"
  for j in "${!f[@]}"; do
    dir=
    case ${f[$j]} in --pages) dir=${f[$((j + 1))]:-}; ;; --pages=*) dir=${f[$j]#--pages=}; ;; *) continue; ;; esac
    if [ ! -f "$dir/labels.jsonl" ]; then
      say "stage ${names[$i]}: --pages $dir has no labels.jsonl (not staged on this machine?)"; exit 2
    fi
  done
done

# A stage's pool lives in POOLS (default /tmp/edgeocr-pools) under its fingerprint (`quantize.train
# --print-pool-key`: the data flags and the tokenizer, what a cached pool is checked against when loaded; not
# --seed, --lr or the other training flags): a later call on the same machine whose stage draws from the same
# pool (another --seed, another learning rate) loads it instead of rendering it again. The pools no stage of
# this call uses are deleted first (each takes 3 MiB a page of the machine's disk).
POOLS=${POOLS:-/tmp/edgeocr-pools}
# the key and the pools are made with INIT's tokenizer and weights (a machine whose copy of the tree carries
# demo_model/ without its weights can still start from a checkpoint carried beside it)
INIT=${INIT:-demo_model}
caches=()
for i in "${!names[@]}"; do
  read -r -a f <<<"${flags[$i]}"
  key=$(python3 -m quantize.train "$RUN/pool-key" --init "$INIT" --print-pool-key "${common[@]}" "${f[@]}") \
    || { say "stage ${names[$i]}: its flags are refused (above)"; exit 2; }
  caches+=("$POOLS/$key")
done
mkdir -p "$POOLS"
for d in "$POOLS"/*/; do
  d=${d%/}
  [[ "$(basename "$d")" =~ ^[0-9a-f]{16}$ ]] && { [ -f "$d/meta.pt" ] || [ -f "$d/canvases.npy" ]; } || continue
  case " ${caches[*]} " in *" $d "*) ;; *) say "deleting the page pool $d (no stage of this call uses it)"; rm -rf "$d"; ;; esac
done

# every stage's pool, one after another in the background (all host cores but one: a stage trains meanwhile),
# unless a finished one with its key is there already;
# a pool that fails leaves a .failed marker and stops the stages; the pools still rendering when the script ends
# are stopped
T0=$(date +%s)
left_s() { echo $(( ${DEADLINE_S:-560} - $(date +%s) + T0 - ${RESERVE_S:-150} )); }
workers=$(( $(nproc) > 2 ? $(nproc) - 1 : 1 ))
rm -f "$RUN"/pool-*.ready "$RUN"/pool-*.failed
(
  for i in "${!names[@]}"; do
    read -r -a f <<<"${flags[$i]}"
    if [ -f "${caches[$i]}/meta.pt" ] && [ -f "${caches[$i]}/canvases.npy" ]; then
      echo "pool: ${caches[$i]} is there (rendered by an earlier call)" >"$RUN/pool-${names[$i]}.log"
      touch "$RUN/pool-${names[$i]}.ready"
    elif python3 -m quantize.train "$RUN/pool-only-${names[$i]}" --init "$INIT" --budget-s 0 --workers "$workers" \
      --pool-cache "${caches[$i]}" "${common[@]}" "${f[@]}" >"$RUN/pool-${names[$i]}.log" 2>&1; then
      touch "$RUN/pool-${names[$i]}.ready"
    else
      touch "$RUN/pool-${names[$i]}.failed"; exit 1
    fi
  done
) &
pool_pid=$!
trap 'rc=$?; pkill -P "$pool_pid" 2>/dev/null || true; kill "$pool_pid" 2>/dev/null || true; exit $rc' EXIT

prev=$INIT
ran=()
for i in "${!names[@]}"; do
  n=${names[$i]}
  while [ ! -f "$RUN/pool-$n.ready" ] && [ "$(left_s)" -ge 30 ]; do
    if [ -f "$RUN/pool-$n.failed" ]; then say "stage $n: its page pool failed:"; tail -15 "$RUN/pool-$n.log" | tee -a "$LOG"; exit 1; fi
    sleep 1
  done
  # a stage is cut to what is left before DEADLINE_S, less RESERVE_S for its start (pool and model loads, about
  # 40 s), the checkpoint's packing and the measuring, so a call under a time limit always brings its checkpoint
  # back (and, with the default reserve, its measurements)
  left=$(left_s)
  if [ "$left" -lt 30 ]; then say "stage $n and after: skipped, only $left s left before DEADLINE_S"; break; fi
  grep -hE "pool:.*pages \(|pool: .* is there" "$RUN/pool-$n.log" | tee -a "$LOG" || true
  read -r -a f <<<"${flags[$i]}"
  s=${secs[$i]}
  if [ "$s" -gt "$left" ]; then say "stage $n: cut from $s s to $left s (DEADLINE_S ${DEADLINE_S:-560})"; s=$left; fi
  say "stage $n: $s s from $prev: ${flags[$i]}"
  python3 -m quantize.train "$RUN/$n" --init "$prev" --gpu-seconds "$s" --pool-cache "${caches[$i]}" \
    "${common[@]}" "${f[@]}" >"$RUN/$n.log" 2>&1 || { tail -20 "$RUN/$n.log" | tee -a "$LOG"; exit 1; }
  grep -E "step .*loss" "$RUN/$n.log" | awk 'NR % 20 == 1' | tail -8 | sed "s/^/$n: /" | tee -a "$LOG"
  grep -E "step .*loss" "$RUN/$n.log" | tail -1 | sed "s/^/$n: /" | tee -a "$LOG"
  prev=$RUN/$n/checkpoint
  ran+=("$n")
done
[ ${#ran[@]} -gt 0 ] || { say "no stage ran: nothing to pack"; exit 3; }
[ ${#ran[@]} -eq ${#names[@]} ] && wait "$pool_pid"
say "stages that ran: ${ran[*]}"

# the checkpoint comes back first, so a call cut off while measuring still returns what it trained
stage_files=()
for n in "${ran[@]}"; do
  for f in train_log.jsonl run_summary.json train_config.json; do
    cp "$RUN/$n/$f" "$RUN/$n-$f" && stage_files+=("$n-$f")
  done
done
rm -rf "$RUN/checkpoint" && cp -r "$prev" "$RUN/checkpoint"
(cd "$RUN" && tar czf "$OUT/final.tar.gz" checkpoint "${stage_files[@]}")
say "checkpoint: $OUT/final.tar.gz"

say "measuring $prev"
if [ "${DIAG_PAGES:-8}" -gt 0 ]; then
  python3 scripts/diag_image_use.py "$prev" --device "${DEVICE:-cuda}" --pages "${DIAG_PAGES:-8}" --levels 0,0.5,1 \
    --json "$OUT/diag.json" 2>&1 | grep -vE "Loading|Writing" | tee -a "$LOG"
fi
if [ "${EVAL_PAGES:-8}" -gt 0 ]; then
  python3 scripts/eval_ckpt.py "$prev" --device "${DEVICE:-cuda}" --pages "${EVAL_PAGES:-8}" --batch "${EVAL_BATCH:-8}" \
    --json "$OUT/eval.json" 2>&1 | grep -vE "Loading|Writing" | tee -a "$LOG"
fi
if [ "${EVAL_HTML_PAGES:-8}" -gt 0 ]; then
  python3 scripts/eval_ckpt.py "$prev" --device "${DEVICE:-cuda}" --pages "${EVAL_HTML_PAGES:-8}" --set eval_html \
    --batch "${EVAL_BATCH:-8}" \
    --json "$OUT/eval_html.json" 2>&1 | grep -vE "Loading|Writing" | tee -a "$LOG"
fi
say "done"
