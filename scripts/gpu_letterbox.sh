#!/usr/bin/env bash
# On the GPU machine (CUDA torch, transformers and onnxruntime-gpu importable; SITE=/tmp/site is put first on
# PYTHONPATH if it exists): the CUDA letterbox kernels and the first token they give, in one call.
#   1. the GPU tests of the kernels (bit-identical to the exact path; the demo model's tokens with them) and of
#      the demo model's native step (tests/test_gpu.py), output in pytest.log
#   2. scripts/gpu_native_step.sh (real-size architecture on random weights: native step FP16 / 8-bit / 8-bit
#      embedding; bench with the default CUDA preprocessing, now the kernels; profiles; device memory; tokens),
#      cut at NATIVE_HARD_S (330 s), results in native/
#   3. `edgeocr bench` of the native FP16 artifact with EDGEOCR_LETTERBOX=graph (the ONNX preprocessing graph
#      the kernels replace) and with --preprocess exact, beside step 2's default: first token medians
# Everything lands in $OUT/results.tar.gz (one file: a call brings back only a few).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SITE=${SITE:-/tmp/site}
export PYTHONPATH=$([ -d "$SITE" ] && echo "$SITE:")$ROOT PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/out}
R=$(mktemp -d)
IMG=$ROOT/calibration_data/eval/000000.jpg
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$R/run.log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$R/run.log"
say "gpu tests"
timeout -k 5 "${TESTS_S:-170}" $PY -m pytest -m gpu -q -s -p no:cacheprovider tests/test_gpu.py \
  -k "letterbox or demo_native_step" > "$R/pytest.log" 2>&1
rc_tests=$?
say "gpu tests rc $rc_tests: $(tail -1 "$R/pytest.log")"
say "native step"
OUT=$R/native HARD_S=${NATIVE_HARD_S:-330} DEADLINE_S=${NATIVE_HARD_S:-330} bash scripts/gpu_native_step.sh \
  > "$R/native_step.out" 2>&1
say "native step rc $?"
for v in graph:device exact:exact; do
  name=${v%%:*} pre=${v##*:}
  [ -d /tmp/work-native/native ] || break
  EDGEOCR_LETTERBOX=$([ "$name" = graph ] && echo graph || echo kernels) EDGEOCR_NATIVE_STEP=1 timeout 60 \
    $PY -m edgeocr bench /tmp/work-native/native --device cuda --tokens 256 --repeats 2 --cuda-graph on \
    --preprocess "$pre" --image "$IMG" --json "$R/bench_native_$name.json" >> "$R/run.log" 2>&1
  say "bench letterbox $name rc $?"
done
say "done"
tar czf "$OUT/results.tar.gz" -C "$R" .
exit $rc_tests
