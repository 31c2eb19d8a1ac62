#!/usr/bin/env bash
# On an NVIDIA GPU (onnxruntime-gpu and ray[data] 2.60 importable): `edgeocr run --device cuda` against
# `edgeocr run --ray local --ray-actors 1` (one GPU actor) on the same PAGES pages, TOKENS new tokens at most, the
# artifact ART (default: the real-size architecture on random weights, FP16, GroupQueryAttention, in-graph
# selection, SLOTS slots, fused for CUDA unless FUSE=0: scripts/gpu_realsize.sh, shared with
# scripts/gpu_slots_bench.sh).  Ray runs at the default 2 pages per slot per actor call and at CALL_PAGES pages
# per call.  DEVICE=cpu runs the same comparison on the CPU with every GPU hidden.
#
# Pages: calibration_data/eval then eval_html (128 distinct images), copied under distinct names round after round
# until there are PAGES (default 384: 3 rounds, so each image is read 3 times), enough that the fixed costs (Ray's
# start, the actor's model load) do not dominate.
#
# Ray's overhead against the local run, three ways (each: Ray's time / the local run's time - 1):
#   wall    the whole command, timed here: Ray's start and stop and the model loads included
#   run     the command's own "N pages in X s" line: the local run's starts after the model load, Ray's before
#           Ray Data starts the actor (its start and model load included)
#   steady  the rate from the first page finished to the last.  Ray: the closing line's "then R pages/s" (the
#           actor stamps when it finished each page).  Local: (N - 1) / (run - first), where first is the
#           timings_ms.total of the local run's first row (rows are written as pages finish; total runs from
#           the page's preparation, which starts with the run, to its end).  This is the rate an archive run
#           sees once the actors are up.
# Prints one line per run (exit code, wall seconds, the run's closing line), the three overheads, and how many
# pages' texts equal the local run's (with random weights the logits are nearly flat, so a page decoded in another
# mix of slots can differ in FP16 without Ray being wrong: check texts on a trained model).  JSON in
# $OUT/ray_bench.json, log in $OUT/ray_bench.log.
#   OUT=/tmp/out bash scripts/gpu_ray_bench.sh
#   DEVICE=cpu PAGES=16 TOKENS=8 ART=/tmp/demo-fp32 OUT=/tmp/rb bash scripts/gpu_ray_bench.sh   # a check on a CPU
set -uo pipefail
export PYTHONUNBUFFERED=1 RAY_TMPDIR=${RAY_TMPDIR:-/tmp/ray-bench}
OUT=${OUT:-/tmp/out}; W=${W:-/tmp/work}; mkdir -p "$OUT" "$W" "$RAY_TMPDIR"
PAGES=${PAGES:-384}; TOKENS=${TOKENS:-256}; SLOTS=${SLOTS:-8}; CALL_PAGES=${CALL_PAGES:-$((8 * SLOTS))}
DEVICE=${DEVICE:-cuda}
[ "$DEVICE" = cpu ] && export CUDA_VISIBLE_DEVICES= FUSE=${FUSE:-0}   # the cuda fusion target does not load on a CPU
PY=${PYTHON:-python3}
LOG=$OUT/ray_bench.log
if [ -z "${ART:-}" ]; then
  # shellcheck source=scripts/gpu_realsize.sh
  source "$(dirname "$0")/gpu_realsize.sh"
  realsize_slots "$SLOTS" || exit 1
  ART=$SLOTS_ART
fi
rm -rf "$W/ray-in" && mkdir -p "$W/ray-in"
mapfile -t images < <(ls calibration_data/eval/*.jpg calibration_data/eval_html/*.jpg)
[ ${#images[@]} -gt 0 ] || { echo "no pages in calibration_data/eval, eval_html: run from the repository root"; exit 1; }
for ((i = 0; i < PAGES; i++)); do    # round r: r000-eval-000000.jpg ...; the same image again each round
  f=${images[i % ${#images[@]}]}
  cp "$f" "$W/ray-in/r$(printf '%03d' $((i / ${#images[@]})))-$(basename "$(dirname "$f")")-$(basename "$f")"
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
names = [p.name for p in (w / "ray-in").iterdir()]        # r000-eval-000000.jpg: round, then the image
res = {"artifact": art, "pages": len(names), "distinct_images": len({n.split("-", 1)[1] for n in names}), "runs": {}}
local = rows("local")
for item in runs:
    name, rc, ms = item.split(":")
    err = (w / f"{name}.err").read_text()
    m = re.search(r"^(\d+) pages in ([\d.]+) s", err, re.M)
    r = rows(name)
    v = res["runs"][name] = {
        "exit_code": int(rc), "wall_s": int(ms) / 1000, "run_s": float(m.group(2)) if m else None,
        "rows": len(r), "pages_per_s_wall": len(r) / (int(ms) / 1000),
        "text_equal_to_local": sum(1 for k, x in r.items() if k in local and x.get("text") == local[k].get("text"))}
    if name == "local":       # the first page finished: the first row with timings (rows, and r, in finishing order)
        first = next((x["timings_ms"]["total"] / 1000 for x in r.values() if "timings_ms" in x), None)
        if v["run_s"] and first is not None and v["run_s"] > first and len(r) > 1:
            v["first_page_s"], v["steady_pages_per_s"] = first, (len(r) - 1) / (v["run_s"] - first)
    else:
        s = re.search(r"first page after ([\d.]+) s .*?, then ([\d.]+) pages/s", err)
        if s:
            v["first_page_s"], v["steady_pages_per_s"] = float(s.group(1)), float(s.group(2))
base = res["runs"]["local"]
for name, v in res["runs"].items():
    if name == "local":
        continue
    if base["exit_code"] > 1 or v["exit_code"] > 1 or not (base["run_s"] and v["run_s"]):
        print(f"{name}: no overhead figure (a run failed: exit codes {base['exit_code']} / {v['exit_code']})")
        continue
    v["overhead_wall"] = v["wall_s"] / base["wall_s"] - 1
    v["overhead_run"] = v["run_s"] / base["run_s"] - 1
    steady = "no steady figure (a run has no first-to-last rate)"
    if base.get("steady_pages_per_s") and v.get("steady_pages_per_s"):
        v["overhead_steady"] = base["steady_pages_per_s"] / v["steady_pages_per_s"] - 1
        steady = (f"{v['overhead_steady'] * 100:+.1f} % steady ({v['steady_pages_per_s']:.2f} against "
                  f"{base['steady_pages_per_s']:.2f} pages/s; first page after {v['first_page_s']:.1f} s against "
                  f"{base['first_page_s']:.1f} s)")
    print(f"{name}: overhead {v['overhead_wall'] * 100:+.1f} % wall, {v['overhead_run'] * 100:+.1f} % run, {steady}; "
          f"{v['text_equal_to_local']}/{len(local)} texts equal to the local run's")
Path(out).write_text(json.dumps(res, indent=1))
PYEOF
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"; } >> "$LOG"
