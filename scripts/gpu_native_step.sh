#!/usr/bin/env bash
# The native decode step on a CUDA GPU, bounded by HARD_S (530 s) (CUDA torch and onnxruntime-gpu importable;
# SITE=/tmp/site, an extra import folder, is put first on PYTHONPATH if it exists):
#   1. the real-size architecture on random weights, exported FP16 (gqa + selection in the graph, 4,096-token
#      cache), fused for CUDA, then `quantize native-step` of the fused artifact (NATIVE_FROM=export: of the
#      exported one), with FP16 and 8-bit weights
#   2. every kernel of one decode step against its numpy twin, on a page's real state (check.json)
#   3. `edgeocr bench` of both native-step artifacts with the native step and with ONNX Runtime's step
#      (EDGEOCR_NATIVE_STEP=1 / 0: the same weights, the same prefill), and of the fused artifact they were made from
#   4. the kernels of a decode step (gpu_profile.py) and device memory after two pages (gpu_perf.py memory, the
#      runtime's settings and the tuned ones); native8e: 8-bit weights and an 8-bit embedding (--embedding int8)
#   5. tokens of the native step against ONNX Runtime's on two eval pages (64 tokens, past the end token), FP16 and
#      native8e (its GatherBlockQuantized prefill against the native 8-bit embedding)
#   6. as time allows: the decode-kernel microbenchmark against cuBLAS and SDPA (gpu_decode_kernels.py)
# Results in $OUT: summary.json, bench.txt, profile.txt, run.log.
#   scripts/gpu_native_step.sh
#   scripts/gpu_native_step.sh --cpu-tiny   steps 1, 3 and 5 on the CPU with a tiny FP32 checkpoint and the numpy
#                                           twins (checks the script; the kernel check, profile and memory need CUDA)
set -uo pipefail
MODE=gpu
[ "${1:-}" = "--cpu-tiny" ] && MODE=cpu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SITE=${SITE:-/tmp/site}
export PYTHONPATH=$([ -d "$SITE" ] && echo "$SITE:")$ROOT PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=${WORK:-/tmp/work-native}; R=$W/results; mkdir -p "$W" "$R"
TOKENS=${TOKENS:-256}
DEADLINE_S=${DEADLINE_S:-420}
HARD_S=${HARD_S:-530}
IMG=$ROOT/calibration_data/eval/000000.jpg
LOG=$OUT/run.log; : > "$LOG"
T0=$(date +%s)
if [ $MODE = gpu ]; then DEV=cuda; TARGET=cuda; NATIVE=1; PRECISION=fp16; GRAPH="--cuda-graph on"
else DEV=cpu; TARGET=portable; NATIVE=numpy; PRECISION=fp32; GRAPH=""; TOKENS=${TOKENS_CPU:-8}; fi

say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }
step() { local name=$1; shift; local t=$(date +%s); local left=$(( HARD_S - (t - T0) ))
  [ "$left" -gt 5 ] || { say "-- skipping $name: past ${HARD_S} s"; return 124; }
  say "-- $name"; timeout -k 5 "$left" "$@" >> "$LOG" 2>&1; local rc=$?
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $(( $(date +%s) - t ))}" > "$R/step_${name}.json"
  [ $rc = 0 ] || say "   $name failed (rc $rc), see run.log"; return $rc; }
in_time() { [ $(( $(date +%s) - T0 )) -lt "$DEADLINE_S" ] || { say "-- skipping $1: past ${DEADLINE_S} s"; return 1; }; }

say "mode $MODE, device $DEV, native step $NATIVE, work $W"
# 1. artifacts
if [ $MODE = gpu ]; then
  CKPT=$W/real-ckpt
  [ -f $CKPT/config.json ] || step checkpoint $PY -m quantize.realsize $CKPT
  EXPORT_ARGS="--cache-len 4096 --device cuda"
else
  CKPT=$W/tiny-ckpt
  [ -f $CKPT/config.json ] || step checkpoint $PY -m quantize tiny $CKPT --config tiny-a --seed 1
  EXPORT_ARGS="--cache-len 1536 --prefill-len 1400"
fi
[ -f $W/export/manifest.json ] || step export $PY -m quantize export $CKPT $W/export --precision $PRECISION \
  --attention gqa --select-on-device $EXPORT_ARGS
rm -rf $W/fused $W/native $W/native8 $W/native8e
step fuse $PY -m quantize fuse $W/export $W/fused --target $TARGET
step native $PY -m quantize native-step $W/${NATIVE_FROM:-fused} $W/native
step native8 $PY -m quantize native-step $W/${NATIVE_FROM:-fused} $W/native8 --weights int8 --embedding float
step native8e $PY -m quantize native-step $W/${NATIVE_FROM:-fused} $W/native8e --weights int8 --embedding int8

# 2. each kernel against its numpy twin, after a page's prefill and 16 steps
step check env EDGEOCR_NATIVE_STEP=$NATIVE $PY - "$R/check.json" $W/native $DEV "$IMG" <<'EOF'
import json, sys
import numpy as np
from edgeocr.model import OCRModel
out, art, dev, img = sys.argv[1:]
m = OCRModel(art, device=dev)
s = m.session
from edgeocr.decode import DecodeOptions
m.recognize(img, task="spotting", options=DecodeOptions(max_new_tokens=16, ignore_stop=True))
rows = s.check_kernels() if s.engine == "native-cuda" else []
worst = {}
for r in rows:
    k = r["kernel"]
    e = r.get("max_rel_err", float(r.get("mismatches", 0)))
    worst[k] = max(worst.get(k, 0.0), e)
res = {"engine": s.engine, "launches_checked": len(rows), "worst_by_kernel": worst,
       "bad": [r for r in rows if r.get("mismatches", 0) or r.get("max_rel_err", 0) > 2e-2 or not r.get("finite", True)][:20]}
json.dump(res, open(out, "w"), indent=1); print(json.dumps({k: v for k, v in res.items() if k != "bad"}), len(res["bad"]), "bad")
EOF

# 3. bench: native step, ONNX Runtime's step on the same artifact, the fused artifact it came from
: > "$OUT/bench.txt"; : > "$OUT/profile.txt"
bench() { local name=$1 art=$2 native=$3
  step bench_$name env EDGEOCR_NATIVE_STEP=$native $PY -m edgeocr bench $art --device $DEV --tokens $TOKENS \
    --repeats 2 $GRAPH --image "$IMG" --json "$R/bench_$name.json" \
    && $PY - "$R/bench_$name.json" "$name" >> "$OUT/bench.txt" <<'EOF'
import json, sys
from edgeocr.bench import BenchResult, format_table
d = json.load(open(sys.argv[1]))
print(f"##### {sys.argv[2]}"); print(format_table(BenchResult(**d["edgeocr"]))); print()
EOF
}
bench native $W/native $NATIVE
bench native_ort_step $W/native 0
bench fused $W/fused 0
bench native8 $W/native8 $NATIVE
bench native8_ort_step $W/native8 0
bench native8e $W/native8e $NATIVE
bench native8e_ort_step $W/native8e 0

# 4. kernels per decode step, device memory
if [ $MODE = gpu ]; then
  for n in native:$NATIVE native8:$NATIVE fused:0; do
    name=${n%%:*} native=${n##*:}; art=$W/$name
    step profile_$name env EDGEOCR_NATIVE_STEP=$native $PY scripts/gpu_profile.py $art --device cuda --cuda-graph \
      --label $name --json "$R/profile_$name.json" && $PY -c "
import json; d = json.load(open('$R/profile_$name.json'))
print('#####', d['label'])
for s in d['stages']:
    print(f\"== {s['stage']}: wall {s['wall_ms']:.3f} ms, GPU busy {s['gpu_busy_ms']:.3f} ms, {s['kernels']:.0f} kernels\")
    for k in s['top']: print(f\"   {k['ms']:8.3f} ms {k['count']:6.1f}x  {k['kernel'][:110]}\")
print()" >> "$OUT/profile.txt"
  done
  for art in native native8 native8e; do
    for config in runtime tuned; do
      step memory_${art}_$config env EDGEOCR_NATIVE_STEP=1 $PY scripts/gpu_perf.py memory $W/$art --config $config \
        --device cuda --tokens $TOKENS --image "$IMG" --json "$R/memory_${art}_$config.json"
    done
  done
fi

# 5. tokens: native step against ONNX Runtime's, same artifact
for art in native native8e; do
  step tokens_$art $PY scripts/native_step_tokens.py "$R/tokens_$art.json" $W/$art $DEV $NATIVE
done

# 6. as time allows
[ $MODE = gpu ] && in_time "decode kernels against cuBLAS" && step kernels $PY scripts/gpu_decode_kernels.py \
  --json "$R/decode_kernels.json"

$PY - "$R" "$OUT/summary.json" <<'EOF' 2>&1 | tee -a "$LOG"
import glob, json, os, sys
r, out = sys.argv[1:]
summary = {os.path.basename(f)[:-5]: json.load(open(f)) for f in sorted(glob.glob(os.path.join(r, "*.json")))}
json.dump(summary, open(out, "w"), indent=1)
for k in ("bench_native", "bench_native_ort_step", "bench_fused", "bench_native8", "bench_native8_ort_step",
          "bench_native8e", "bench_native8e_ort_step"):
    e = summary.get(k, {}).get("edgeocr")
    if e:
        print(f"{k}: decode {e['decode_ms_per_token']:.3f} ms/token, first token {e['first_token_ms']:.1f} ms, "
              f"backend {e['backend']}")
EOF
say "done in $(( $(date +%s) - T0 )) s; results in $OUT"
