#!/usr/bin/env bash
# On an NVIDIA GPU (onnxruntime-gpu and ray[data] 2.60 importable): `edgeocr run --device cuda` against
# `edgeocr run --ray local --ray-actors 1` (one GPU actor), on the same PAGES distinct pages (calibration_data/eval,
# then eval_html), TOKENS new tokens at most, the artifact ART (default: the real-size architecture on random
# weights, FP16, GroupQueryAttention, in-graph selection, SLOTS slots: scripts/gpu_realsize.sh, shared with
# scripts/gpu_slots_bench.sh).  Ray runs at the default 2 pages per slot per actor call and at
# CALL_PAGES pages per call.  DEVICE=cpu runs the same comparison on the CPU with every GPU hidden.
# Prints one line per run (exit code, wall seconds of the whole command with Ray's start and the model loads, and
# the run's own "pages in" line), Ray's overhead against the local run, and how many pages' texts equal the local
# run's (with random weights the logits are nearly flat, so a page decoded in another mix of slots can differ in
# FP16 without Ray being wrong: check texts on a trained model).  JSON in $OUT/ray_bench.json, log in
# $OUT/ray_bench.log.
#   OUT=/tmp/out bash scripts/gpu_ray_bench.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 RAY_TMPDIR=${RAY_TMPDIR:-/tmp/ray-bench}
OUT=${OUT:-/tmp/out}; W=${W:-/tmp/work}; mkdir -p "$OUT" "$W" "$RAY_TMPDIR"
PAGES=${PAGES:-96}; TOKENS=${TOKENS:-256}; SLOTS=${SLOTS:-8}; CALL_PAGES=${CALL_PAGES:-$((8 * SLOTS))}
DEVICE=${DEVICE:-cuda}
[ "$DEVICE" = cpu ] && export CUDA_VISIBLE_DEVICES=
PY=${PYTHON:-python3}
LOG=$OUT/ray_bench.log
if [ -z "${ART:-}" ]; then
  # shellcheck source=scripts/gpu_realsize.sh
  source "$(dirname "$0")/gpu_realsize.sh"
  realsize_slots "$SLOTS" || exit 1
  ART=$W/slots$SLOTS
fi
rm -rf $W/ray-in && mkdir -p $W/ray-in
ls calibration_data/eval/*.jpg calibration_data/eval_html/*.jpg | head -n "$PAGES" | while read -r f; do
  cp "$f" "$W/ray-in/$(basename "$(dirname "$f")")-$(basename "$f")"
done
runs=()
bench() {   # name, extra args: one timed `edgeocr run`, recorded as name:exit code:wall seconds
  local name=$1; shift
  local t0 t1 rc
  t0=$(date +%s%N)
  $PY -m edgeocr run $W/ray-in --model "$ART" --device "$DEVICE" --task structured_parse --max-new-tokens "$TOKENS" \
      --out "$W/$name.jsonl" --overwrite --no-progress "$@" 2>"$W/$name.err"
  rc=$?
  t1=$(date +%s%N)
  runs+=("$name:$rc:$(( (t1 - t0) / 1000000 ))")
  printf '%-24s rc %d  wall %8s s | %s\n' "$name" $rc "$(awk "BEGIN { printf \"%.1f\", ($t1 - $t0) / 1e9 }")" \
      "$(grep -E '^[0-9]+ pages in' "$W/$name.err" | tail -1)" | tee -a "$LOG"
  [ $rc -le 1 ] || tail -20 "$W/$name.err" | tee -a "$LOG"      # 1: a page failed (its error row is written)
}
bench local
bench ray-2-per-slot --ray local --ray-actors 1
bench ray-$CALL_PAGES-per-call --ray local --ray-actors 1 --ray-call-pages "$CALL_PAGES"
$PY - "$W" "$OUT/ray_bench.json" "$ART" "${runs[@]}" <<'PYEOF' | tee -a "$LOG"
import json, re, sys
from pathlib import Path
w, out, art, runs = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
def rows(name):
    p = w / f"{name}.jsonl"
    return {(r["file"], r.get("page")): r for r in map(json.loads, p.read_text().splitlines())} if p.exists() else {}
res = {"artifact": art, "pages": len(list((w / "ray-in").iterdir())), "runs": {}}
local = rows("local")
for item in runs:
    name, rc, ms = item.split(":")
    m = re.search(r"^(\d+) pages in ([\d.]+) s", (w / f"{name}.err").read_text(), re.M)
    r = rows(name)
    res["runs"][name] = {"exit_code": int(rc), "wall_s": int(ms) / 1000, "run_s": float(m.group(2)) if m else None,
                         "rows": len(r), "pages_per_s_wall": len(r) / (int(ms) / 1000),
                         "text_equal_to_local": sum(1 for k, v in r.items() if k in local
                                                    and v.get("text") == local[k].get("text"))}
base = res["runs"]["local"]
for name, v in res["runs"].items():
    if name == "local":
        continue
    if base["exit_code"] > 1 or v["exit_code"] > 1 or not (base["run_s"] and v["run_s"]):
        print(f"{name}: no overhead figure (a run failed: exit codes {base['exit_code']} / {v['exit_code']})")
        continue
    v["overhead_wall"] = v["wall_s"] / base["wall_s"] - 1
    v["overhead_run"] = v["run_s"] / base["run_s"] - 1
    print(f"{name}: overhead {v['overhead_wall'] * 100:+.1f} % end to end, {v['overhead_run'] * 100:+.1f} % once "
          f"running; {v['text_equal_to_local']}/{len(local)} texts equal to the local run's")
Path(out).write_text(json.dumps(res, indent=1))
PYEOF
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"; } >> "$LOG"
