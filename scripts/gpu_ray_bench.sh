#!/usr/bin/env bash
# On an NVIDIA GPU (onnxruntime-gpu and ray[data] 2.60 importable): `edgeocr run --device cuda` against
# `edgeocr run --ray local` with one GPU actor, on the same PAGES distinct pages (calibration_data/eval, then
# eval_html), TOKENS new tokens at most, the artifact ART (default: the real-size architecture on random weights,
# FP16, GroupQueryAttention, in-graph selection, SLOTS slots; built here if missing, as scripts/gpu_slots_bench.sh
# builds it); DEVICE=cpu runs the same comparison on the CPU.  Ray runs at the default 2 pages per slot per actor call and at CALL_PAGES pages per call.
# Prints one line per run (wall seconds of the whole command, Ray's start and the model loads included, and the
# run's own "pages in" line), Ray's overhead against the local run, and whether every page's text is the same;
# JSON in $OUT/ray_bench.json, log in $OUT/ray_bench.log.  docs/distributed.md has the figures.
#   OUT=/tmp/out bash scripts/gpu_ray_bench.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 RAY_TMPDIR=${RAY_TMPDIR:-/tmp/ray-bench}
OUT=${OUT:-/tmp/out}; W=${W:-/tmp/work}; mkdir -p "$OUT" "$W" "$RAY_TMPDIR"
PAGES=${PAGES:-96}; TOKENS=${TOKENS:-256}; SLOTS=${SLOTS:-8}; CALL_PAGES=${CALL_PAGES:-$((8 * SLOTS))}
PY=${PYTHON:-python3}
LOG=$OUT/ray_bench.log
if [ -z "${ART:-}" ]; then
  [ -d $W/real-ckpt ] || $PY -m quantize.realsize $W/real-ckpt 2>&1 | tail -1
  [ -f $W/real-fp16-gqa/manifest.json ] || $PY -m quantize export $W/real-ckpt $W/real-fp16-gqa --precision fp16 \
      --device cuda --attention gqa --select-on-device --cache-len 4096 2>&1 | tail -1
  ART=$W/slots$SLOTS
  [ -f $ART/manifest.json ] || $PY -m quantize reslot $W/real-fp16-gqa $ART --slots $SLOTS 2>&1 | tail -1
fi
rm -rf $W/ray-in && mkdir -p $W/ray-in
ls calibration_data/eval/*.jpg calibration_data/eval_html/*.jpg | head -n "$PAGES" | while read -r f; do
  cp "$f" "$W/ray-in/$(basename "$(dirname "$f")")-$(basename "$f")"
done
n=$(ls $W/ray-in | wc -l)
runs=()
bench() {   # name, extra args
  local name=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  $PY -m edgeocr run $W/ray-in --model "$ART" --device "${DEVICE:-cuda}" --task structured_parse --max-new-tokens "$TOKENS" \
      --out "$W/$name.jsonl" --overwrite --no-progress "$@" 2>"$W/$name.err"
  local rc=$?
  t1=$(date +%s.%N)
  local line; line=$(grep -E '^[0-9]+ pages in' "$W/$name.err" | tail -1)
  printf '%-28s rc %d  wall %6.1f s  %6.3f pages/s | %s\n' "$name" $rc "$(echo "$t1 - $t0" | bc)" \
      "$(echo "$n / ($t1 - $t0)" | bc -l)" "$line" | tee -a "$LOG"
  [ $rc -eq 0 ] || tail -20 "$W/$name.err" | tee -a "$LOG"
  runs+=("$name:$(echo "$t1 - $t0" | bc)")
}
bench local
bench ray-2-per-slot --ray local
bench ray-$CALL_PAGES-per-call --ray local --ray-call-pages "$CALL_PAGES"
$PY - "$W" "$OUT/ray_bench.json" "$n" "$ART" "${runs[@]}" <<'PYEOF' | tee -a "$LOG"
import json, re, sys
from pathlib import Path
w, out, n, art, runs = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
def rows(name):
    p = w / f"{name}.jsonl"
    return {(r["file"], r.get("page")): r for r in map(json.loads, p.read_text().splitlines())} if p.exists() else {}
res = {"pages": n, "artifact": art, "runs": {}}
local = rows("local")
for item in runs:
    name, wall = item.split(":")
    err = (w / f"{name}.err").read_text()
    m = re.search(r"^(\d+) pages in ([\d.]+) s", err, re.M)
    r = rows(name)
    same = sum(1 for k, v in r.items() if k in local and v.get("text") == local[k].get("text"))
    res["runs"][name] = {"wall_s": float(wall), "run_s": float(m.group(2)) if m else None, "rows": len(r),
                         "text_equal_to_local": same}
base = res["runs"]["local"]
for name, v in res["runs"].items():
    if name == "local":
        continue
    v["overhead_wall"] = v["wall_s"] / base["wall_s"] - 1
    v["overhead_run"] = v["run_s"] / base["run_s"] - 1 if v["run_s"] and base["run_s"] else None
    print(f"{name}: overhead {v['overhead_wall'] * 100:+.1f} % end to end, "
          f"{(v['overhead_run'] or float('nan')) * 100:+.1f} % once running; "
          f"{v['text_equal_to_local']}/{len(local)} texts equal to the local run's")
Path(out).write_text(json.dumps(res, indent=1))
PYEOF
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"; } >> "$LOG"
