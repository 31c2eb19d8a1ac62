#!/usr/bin/env bash
# One command for the GPU measurements behind docs/perf.md (an H200 with CUDA torch, transformers and the ONNX
# Runtime GPU wheels importable; SITE=/tmp/site is put first on PYTHONPATH if it exists):
#   1. probe which fused ops this ONNX Runtime's CUDA EP runs, numerically (scripts/gpu_perf.py probe)
#   2. the real-size architecture on random weights, exported FP16 (gqa + selection in the graph, CUDA graph),
#      fused for CUDA (quantize fuse; ops the probe rejected are left out), and weight-INT8 of the fused
#      artifact (decoder and vision MatMuls as MatMulNBits), and the fused artifact with device-resident step
#      state (quantize step-state: no host-to-device copy in a decode step); the decoder's op counts (nodes.json)
#   3. `edgeocr bench` of fused FP16 (`python -m quantize bench-hf`: beside transformers), fused FP16 with step state
#      and fused weight-INT8 on the eval page
#      (1,093-token prompt, decode per token at that depth; first token from the file on the default
#      preprocessing path, device on CUDA, and from pixels), the kernel count per decode step (gpu_profile.py),
#      device memory after two pages of $TOKENS tokens (runtime settings), time to first token per
#      preprocessing path
#   4. as time allows (DEADLINE_S, default 400 s: nothing new starts later): memory with edgeocr.ort_options'
#      settings, the unfused FP16 benched and profiled for before/after, tokens of fused (and step state) vs unfused
# Every step runs under what is left of HARD_S (default 530 s), so the whole script ends within 9 minutes
# and always packs what it measured.  Results in $OUT (<= 5 files): summary.json (every result), bench.txt,
# profile.txt, run.log.
#
#   scripts/gpu_bench.sh                 on a CUDA machine
#   scripts/gpu_bench.sh --cpu-tiny      the same steps on the CPU with a tiny checkpoint (checks the script;
#                                        portable fusions, ORT node counts instead of CUDA kernels)
set -uo pipefail
MODE=gpu
[ "${1:-}" = "--cpu-tiny" ] && MODE=cpu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SITE=${SITE:-/tmp/site}
export PYTHONPATH=$([ -d "$SITE" ] && echo "$SITE:")$ROOT PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=${WORK:-/tmp/work-perf}; R=$W/results; mkdir -p "$W" "$R"
TOKENS=${TOKENS:-256}
DEADLINE_S=${DEADLINE_S:-400}
HARD_S=${HARD_S:-530}
IMG=$ROOT/calibration_data/eval/000000.jpg
LOG=$OUT/run.log; : > "$LOG"
T0=$(date +%s)
if [ $MODE = gpu ]; then DEV=cuda; TARGET=cuda; GRAPH="--cuda-graph on"; PROF_GRAPH=--cuda-graph; TRACE=cuda
else DEV=cpu; TARGET=portable; GRAPH=""; PROF_GRAPH=""; TRACE=cpu; TOKENS=${TOKENS_CPU:-16}; fi

say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }
# step NAME CMD...: run (under what is left of HARD_S), log its tail, record wall time and exit status; never
# stops the script
step() { local name=$1; shift; local t=$(date +%s); local left=$(( HARD_S - (t - T0) ))
  [ "$left" -gt 5 ] || { say "-- skipping $name: past ${HARD_S} s"; return 124; }
  say "-- $name"; timeout -k 5 "$left" "$@" >> "$LOG" 2>&1; local rc=$?
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $(( $(date +%s) - t ))}" > "$R/step_${name}.json"
  [ $rc = 0 ] || say "   $name failed (rc $rc), see run.log"; return $rc; }
in_time() { [ $(( $(date +%s) - T0 )) -lt "$DEADLINE_S" ] || { say "-- skipping $1: past ${DEADLINE_S} s"; return 1; }; }

say "mode $MODE, device $DEV, fusion target $TARGET, work $W"
step env $PY - <<EOF
import json, platform, subprocess, onnxruntime as o
info = {"onnxruntime": o.__version__, "providers": o.get_available_providers(), "python": platform.python_version()}
try:
    import torch, transformers; info.update(torch=torch.__version__, transformers=transformers.__version__,
                                             cuda=torch.version.cuda)
except Exception as e: info["torch"] = str(e)
try: info["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
except Exception as e: info["gpu"] = str(e)
json.dump(info, open("$R/env.json", "w")); print(info)
EOF

# 1. which fused ops this runtime's CUDA EP runs
FUSE_FLAGS=""
if [ $MODE = gpu ]; then
  step probe $PY scripts/gpu_perf.py probe --device cuda --json "$R/probe.json"
  FUSE_FLAGS=$($PY -c "import json; print(json.load(open('$R/probe.json')).get('fuse_flags', ''))" 2>/dev/null || echo "")
  say "fuse flags from the probe: '${FUSE_FLAGS}'"
fi

# 2. artifacts
if [ $MODE = gpu ]; then
  CKPT=$W/real-ckpt
  [ -f $CKPT/config.json ] || step checkpoint $PY -m quantize.realsize $CKPT
  EXPORT_ARGS="--cache-len 4096 --device cuda"
else
  CKPT=$W/tiny-ckpt
  [ -f $CKPT/config.json ] || step checkpoint $PY -m quantize tiny $CKPT --config tiny-a --seed 1
  EXPORT_ARGS="--cache-len 1536 --prefill-len 1400"
fi
PRECISION=fp16; [ $MODE = cpu ] && PRECISION=fp32   # ONNX Runtime's CPU EP has no FP16 GroupQueryAttention
[ -f $W/fp16/manifest.json ] || step export $PY -m quantize export $CKPT $W/fp16 --precision $PRECISION \
  --attention gqa --select-on-device $EXPORT_ARGS
rm -rf $W/fused $W/w8-fused $W/fused-state
step fuse $PY -m quantize fuse $W/fp16 $W/fused --target $TARGET $FUSE_FLAGS
step step_state $PY -m quantize step-state $W/fused $W/fused-state
step w8_fused $PY -m quantize weight-int8 $W/fused $W/w8-fused
step nodes $PY - "$R/nodes.json" $W/fused $W/fused-state <<'EOF'
import json, sys
from pathlib import Path
from edgeocr.artifact import read
f = read(sys.argv[2]).export["fusion"]["graphs"]["decoder"]
free = ("Constant", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Shape")     # no kernel on CUDA
count = lambda ops: sum(v for k, v in ops.items() if k not in free)              # noqa: E731
out = {"decoder_ops_exported": f["ops_before"], "decoder_ops_fused": f["ops_after"], "passes": f["passes"],
       "decoder_nodes_exported": count(f["ops_before"]), "decoder_nodes_fused": count(f["ops_after"])}
if (Path(sys.argv[3]) / "manifest.json").exists():
    st = read(sys.argv[3]).export["step_state"]
    out.update(decoder_ops_step_state=st["ops_after"], decoder_nodes_step_state=count(st["ops_after"]))
json.dump(out, open(sys.argv[1], "w"), indent=1); print({k: v for k, v in out.items() if "nodes" in k})
EOF

# 3. the fused flavours
bench() { local name=$1 art=$2 cmd="-m edgeocr bench $2"; shift 2
  [ "${1:-}" = hf ] && { cmd="-m quantize bench-hf $art $CKPT"; shift; }    # beside transformers generate
  step bench_$name $PY $cmd --device $DEV --tokens $TOKENS --repeats 2 $GRAPH --image "$IMG" \
    --json "$R/bench_$name.json" "$@" && $PY - "$R/bench_$name.json" "$name" >> "$OUT/bench.txt" <<'EOF'
import json, sys
from edgeocr.bench import BenchResult, format_table
d = json.load(open(sys.argv[1]))
print(f"##### {sys.argv[2]}"); print(format_table(BenchResult(**d["edgeocr"]), d.get("transformers"))); print()
EOF
}
profile() { local name=$1 art=$2
  step profile_$name $PY scripts/gpu_profile.py $art --device $TRACE $PROF_GRAPH --label $name \
    --json "$R/profile_$name.json" && $PY -c "
import json; d = json.load(open('$R/profile_$name.json'))
print('#####', d['label'])
for s in d['stages']:
    print(f\"== {s['stage']}: wall {s['wall_ms']:.3f} ms, GPU busy {s['gpu_busy_ms']:.3f} ms, {s['kernels']:.0f} kernels\")
    for k in s['top']: print(f\"   {k['ms']:8.3f} ms {k['count']:6.1f}x  {k['kernel'][:110]}\")
print()" >> "$OUT/profile.txt"
}
: > "$OUT/bench.txt"; : > "$OUT/profile.txt"
COMPARE=""; [ $MODE = gpu ] && COMPARE=hf
bench fp16_fused $W/fused $COMPARE
bench fp16_fused_state $W/fused-state
bench w8_fused $W/w8-fused
profile fp16_fused $W/fused
profile fp16_fused_state $W/fused-state
profile w8_fused $W/w8-fused
for art in fused w8-fused; do
  step memory_${art}_runtime $PY scripts/gpu_perf.py memory $W/$art --config runtime --device $DEV --tokens $TOKENS \
    --image "$IMG" --json "$R/memory_${art}_runtime.json"
done
step ttft_fused $PY scripts/gpu_perf.py ttft $W/fused "$IMG" --device $DEV --json "$R/ttft_fused.json"

# 4. as time allows
for art in fused w8-fused; do
  in_time "memory of $art, tuned settings" && step memory_${art}_tuned $PY scripts/gpu_perf.py memory $W/$art \
    --config tuned --device $DEV --tokens $TOKENS --image "$IMG" --json "$R/memory_${art}_tuned.json"
done
in_time "unfused FP16 bench" && bench fp16 $W/fp16
in_time "unfused FP16 profile" && profile fp16 $W/fp16
in_time "time to first token, weight-INT8" && step ttft_w8-fused $PY scripts/gpu_perf.py ttft $W/w8-fused "$IMG" \
  --device $DEV --json "$R/ttft_w8-fused.json"
in_time "tokens fused vs unfused" && step tokens $PY - "$R/tokens.json" $DEV $W/fp16 $W/fused $W/w8-fused \
  $W/fused-state <<'EOF'
import json, sys
from pathlib import Path
from edgeocr.dataset import load_dir
from edgeocr.decode import DecodeOptions
from edgeocr.model import OCRModel
out, dev, arts = sys.argv[1], sys.argv[2], sys.argv[3:]
pages = load_dir(Path("calibration_data/eval"))[:2]
o = DecodeOptions(max_new_tokens=64, ignore_stop=True)
runs = {a: [OCRModel(a, device=dev).recognize(p.path, task="spotting", options=o).token_ids for p in pages] for a in arts}
ref = runs[arts[0]]
res = {a: {"tokens": r, "identical_to_" + Path(arts[0]).name: r == ref,
           "first_divergence": [next((i for i, (x, y) in enumerate(zip(t, u)) if x != y), None) for t, u in zip(r, ref)]}
       for a, r in runs.items()}
state = [a for a in arts if Path(a).name == "fused-state"]
if state:                      # the step-state form must give the tokens of the artifact it was made from
    res[state[0]]["identical_to_fused"] = runs[state[0]] == runs[arts[1]]
json.dump(res, open(out, "w"), indent=1); print({a: v["first_divergence"] for a, v in res.items()})
EOF

$PY scripts/gpu_perf.py pack "$R" "$OUT/summary.json" 2>&1 | tee -a "$LOG"     # always, past HARD_S too
say "done in $(( $(date +%s) - T0 )) s; results in $OUT"
ls -la "$OUT" | tee -a "$LOG"
