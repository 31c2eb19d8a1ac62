#!/usr/bin/env bash
# Page views per second of the trainer against an earlier one (default: the single-file trainer of commit
# 2e89686), same machine, same run: tiny model sizes, the same batch, glyph loss and reading-page share,
# steps fixed.  On a CPU this only shows how much per-step host overhead is gone; the GPU figure is what
# the trainer's own run_summary.json reports on the GPU machine.
#   bash scripts/train_throughput.sh [OLD_REV]     (env: STEPS=20 BATCH=8 DEVICE=cpu WORKERS=2 OUT=/tmp/tput)
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:-2e89686}
STEPS=${STEPS:-20}; BATCH=${BATCH:-8}; DEVICE=${DEVICE:-cpu}; WORKERS=${WORKERS:-2}; OUT=${OUT:-/tmp/tput}
PY=${PYTHON:-python3}
rm -rf "$OUT"; mkdir -p "$OUT/old_pkg"
git show "$REV:quantize/train.py" > "$OUT/old_pkg/old_trainer.py"
common=(--tiny --steps "$STEPS" --batch "$BATCH" --workers "$WORKERS" --eval-every 0 --device "$DEVICE"
        --tokenizer demo_model/tokenizer.json --glyph-loss 0.5 --reading-frac 0.2)
t0=$(date +%s.%N)
PYTHONPATH="$PWD:$OUT/old_pkg" $PY -m old_trainer "$OUT/old" "${common[@]}" 2> "$OUT/old.log"
t1=$(date +%s.%N)
PYTHONPATH="$PWD" $PY -m quantize.train "$OUT/new" "${common[@]}" --pool-pages "${POOL:-64}" --log-every 1 \
  2> "$OUT/new.log"
t2=$(date +%s.%N)
$PY - "$OUT" "$BATCH" "$t0" "$t1" "$t2" "$REV" <<'PYEOF'
import json, sys
out, batch, t0, t1, t2, rev = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:6]), sys.argv[6]
rows = {}
for name, wall in (("old", t1 - t0), ("new", t2 - t1)):
    log = [json.loads(x) for x in open(f"{out}/{name}/train_log.jsonl") if '"loss"' in x]
    steady = log[1:]                                  # the first step includes warm-up
    s = sum(x["step_s"] for x in steady)
    rows[name] = {"steps": len(log), "page_views_per_s_training": round(batch * len(steady) / s, 2),
                  "wall_s_whole_command": round(wall, 1), "final_loss": log[-1]["loss"]}
rows["new"]["pool_s"] = json.load(open(f"{out}/new/run_summary.json"))["invocations"][-1]["pool_s"]
rows["speedup_training"] = round(rows["new"]["page_views_per_s_training"] / rows["old"]["page_views_per_s_training"], 2)
rows["old_rev"] = rev
print(json.dumps(rows, indent=2))
json.dump(rows, open(f"{out}/throughput.json", "w"), indent=2)
PYEOF
