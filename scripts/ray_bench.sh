#!/usr/bin/env bash
# pages/s of `edgeocr run` against `edgeocr run --ray local` with 1 and 2 CPU actors, on the same pages: the demo
# model (2 slots) on the first N held-out pages.  Prints one line per run: wall seconds of the whole command
# (Ray start and model loads included), and the run's own "pages in" line.  docs/distributed.md has the figures.
#   bash scripts/ray_bench.sh [N=24] [TOKENS=128]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-24}
TOKENS=${2:-128}
PY=${PYTHON:-.venv/bin/python}
W=$(mktemp -d /tmp/raybench.XXXX)
trap 'rm -rf "$W"' EXIT
export RAY_TMPDIR=$W/ray            # the private Rays' sessions and logs, removed with the rest
"$PY" -c "from quantize.export import ExportOptions, export
export('demo_model', '$W/art', ExportOptions(cache_len=1536, prefill_len=1280, slots=2))" >/dev/null
mkdir "$W/in"
ls calibration_data/eval/*.jpg | head -n "$N" | xargs -I{} cp {} "$W/in/"
run() {   # label, extra args
    local label=$1; shift
    local t0 t1
    t0=$(date +%s.%N)
    "$PY" -m edgeocr run "$W/in" --model "$W/art" --task structured_parse --max-new-tokens "$TOKENS" \
        --out "$W/out.jsonl" --overwrite --no-progress "$@" 2>"$W/err" || true
    t1=$(date +%s.%N)
    printf '%-34s wall %6.1f s  %5.3f pages/s | %s | load %s\n' "$label" "$(echo "$t1 - $t0" | bc)" \
        "$(echo "$N / ($t1 - $t0)" | bc -l)" "$(grep -E '^[0-9]+ pages in' "$W/err")" "$(cut -d' ' -f1-3 /proc/loadavg)"
}
run "edgeocr run (all cores)"
run "edgeocr run --threads 1" --threads 1
run "--ray local, 1 CPU actor" --ray local --ray-actors 1 --threads 1
run "--ray local, 2 CPU actors" --ray local --ray-actors 2 --threads 1
run "--ray local, 1 CPU actor, 2 threads" --ray local --ray-actors 1 --threads 2
