#!/usr/bin/env bash
# edgeocr's CPU artifacts and llama.cpp, back to back on the same cores, for the CPU table of docs/int8.md.
#
#   ARTS="cpu8=DIR [cpu4=DIR fp32=DIR]" scripts/cpu_bench.sh
#
# Each artifact: `edgeocr bench --device cpu --threads THREADS --tokens TOKENS` on the eval page (vision, a
# 1,093-token prefill, TOKENS decode steps, ONNX Runtime's per-step kernel profile).  Between the first artifact
# and the others: scripts/llamacpp_bench.sh --cpu with the same thread count (decode at depth 1,093, the 1,093-token
# prompt, llama-mtmd-cli's image encode), so a busy neighbour shows up in both.  The 1-minute load average is
# recorded before each step.  llama.cpp runs with --poll 0 (POLL): its threads, like edgeocr's, do not
# busy-wait between kernels (the paired rounds below measure its default polling as well).  Env: THREADS (2), TOKENS (64), OUT (/tmp/out-cpu), WORK (where llamacpp_bench.sh
# finds real-ckpt/ and gguf/), LLAMA_SRC, BUILD (a llama.cpp build dir; NATIVE=ON builds for this CPU).
# Then ROUNDS (2) paired decode rounds: llama-bench Q8_0 and F16 at depth 1,093 with its default busy polling and
# with --poll 0, the 1,093-token prompt with --poll 0, then `edgeocr bench` of the first artifact again.
# Results in $OUT: edgeocr-NAME.json, llamacpp.json, llamacpp.log, round*.json, loadavg.txt, summary.json.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
THREADS=${THREADS:-2}; TOKENS=${TOKENS:-64}
OUT=${OUT:-/tmp/out-cpu}; mkdir -p "$OUT"
IMG=${IMG:-$ROOT/calibration_data/eval/000000.jpg}
: "${ARTS:?ARTS=\"name=artifact_dir ...\"}"
LOADS=$OUT/loadavg.txt; : > "$LOADS"
mark() { echo "$1 $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$LOADS"; }
bench() { local name=${1%%=*} dir=${1#*=}
  mark "edgeocr-$name"
  $PY -m edgeocr bench "$dir" --device cpu --threads "$THREADS" --tokens "$TOKENS" --image "$IMG" \
    --json "$OUT/edgeocr-$name.json" | tee "$OUT/edgeocr-$name.txt"; }

set -- $ARTS
bench "$1"; FIRST=${1%%=*}; FIRST_DIR=${1#*=}; shift
mark llamacpp
THREADS=$THREADS POLL=${POLL:-0} NATIVE=${NATIVE:-ON} N_TOKENS=$TOKENS OUT=$OUT bash scripts/llamacpp_bench.sh --cpu \
  > "$OUT/llamacpp-stdout.txt"
for a in "$@"; do bench "$a"; done

# paired decode rounds: llama-bench (Q8_0 and F16, its default busy polling and --poll 0, as edgeocr's threads do
# not spin) and edgeocr's first artifact, alternating, ROUNDS times
LB=${BUILD:-${WORK:-/tmp/work-perf}/llama-build-cpu}/bin/llama-bench
GG=${WORK:-/tmp/work-perf}/gguf
for r in $(seq 1 "${ROUNDS:-2}"); do
  for poll in 50 0; do
    mark "round$r-llamacpp-poll$poll"
    "$LB" -m "$GG/text-q8_0.gguf" -m "$GG/text-f16.gguf" -n "$TOKENS" -d 1093 -p 0 -fa 1 -t "$THREADS" -r 2 \
      --no-warmup --poll $poll -o json > "$OUT/round$r-llamacpp-poll$poll.json" 2>> "$OUT/llamacpp.log"
  done
  mark "round$r-llamacpp-prompt-poll0"
  "$LB" -m "$GG/text-q8_0.gguf" -m "$GG/text-f16.gguf" -n 0 -p 1093 -fa 1 -t "$THREADS" -r 1 --poll 0 -o json \
    > "$OUT/round$r-llamacpp-prompt-poll0.json" 2>> "$OUT/llamacpp.log"
  bench "$FIRST-round$r=$FIRST_DIR"
done
mark done

$PY - "$OUT" "$FIRST" <<'EOF'
import json, sys
from pathlib import Path
out, first = Path(sys.argv[1]), sys.argv[2]
ll = json.loads((out / "llamacpp.json").read_text())
def ms(rows, kind):
    for r in rows if isinstance(rows, list) else []:
        if kind in r["model"]:
            return r["avg_ms_per_token"], r["avg_total_ms"]
    return None, None
q8 = ms(ll["decode_at_depth"], "q8_0")[0]
f16 = ms(ll["decode_at_depth"], "f16")[0]
f16_prompt = ms(ll["prompt"], "f16")[1]
enc = ll.get("mtmd_image_encode_ms") or []
res = {"llamacpp": {"decode_ms_per_token_q8_0": q8, "decode_ms_per_token_f16": f16, "prompt_ms_f16": f16_prompt,
                    "prompt_ms_q8_0": ms(ll["prompt"], "q8_0")[1], "image_encode_ms_f16": min(enc) if enc else None},
       "edgeocr": {}, "loadavg": (out / "loadavg.txt").read_text().splitlines()}
for p in sorted(out.glob("edgeocr-*.json")):
    e = json.loads(p.read_text())["edgeocr"]
    name = p.stem[len("edgeocr-"):]
    res["edgeocr"][name] = {k: e[k] for k in ("decode_ms_per_token", "prefill_ms", "vision_ms", "peak_rss_mib",
                                               "threads", "precision")}
    res["edgeocr"][name]["kernel_share"] = (e.get("cpu_profile") or {}).get("kernel_share")
    if q8:
        res["edgeocr"][name]["decode_vs_llamacpp_q8_0"] = e["decode_ms_per_token"] / q8
    if f16_prompt:
        res["edgeocr"][name]["prefill_vs_llamacpp_f16"] = e["prefill_ms"] / f16_prompt
rounds = {}
for p in sorted(out.glob("round*-llamacpp-*poll*.json")):
    for r in json.loads(p.read_text()):
        kind = "decode_ms_per_token" if r["n_gen"] else "prompt_ms"
        key = f"{Path(r['model_filename']).stem}-{kind}-poll{p.stem.split('poll')[-1]}"
        rounds.setdefault(key, []).append(r["avg_ns"] / 1e6 / (r["n_gen"] or 1))
res["paired_rounds"] = {"llamacpp": rounds, "edgeocr": [
    {k: json.loads(p.read_text())["edgeocr"][k] for k in ("decode_ms_per_token", "prefill_ms", "vision_ms")}
    for p in sorted(out.glob(f"edgeocr-{first}-round*.json"))]}
(out / "summary.json").write_text(json.dumps(res, indent=1))
print(json.dumps(res, indent=1))
EOF
