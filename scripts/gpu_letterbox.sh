#!/usr/bin/env bash
# On the GPU machine (CUDA torch, transformers and onnxruntime-gpu importable; SITE=/tmp/site is put first on
# PYTHONPATH if it exists): the CUDA letterbox kernels and the first token they give, in one call of ~4 min.
#   1. the GPU tests of the kernels (bit-identical to the exact path; the demo model's tokens with them) and of
#      the demo model's native step (tests/test_gpu.py), output in pytest.log
#   2. the real-size architecture on random weights, exported FP16 (gqa, selection in the graph, 4,096-token
#      cache), fused for CUDA, `quantize native-step` of it with FP16 weights and with 8-bit weights and embedding
#   3. `edgeocr bench` of the native FP16 artifact with the default CUDA preprocessing (the kernels), with
#      EDGEOCR_LETTERBOX=graph (the ONNX graph they replace) and with --preprocess exact (Pillow on the host), and
#      of the 8-bit-embedding one: first-token medians beside each other
#   4. device memory after two pages (scripts/gpu_perf.py memory, the runtime's settings) of both native artifacts;
#      tokens of the 8-bit-embedding artifact's native step against ONNX Runtime's step on two eval pages
# Everything lands in $OUT/results.tar.gz (one file: a call brings back only a few); exits with the tests' status.
set -uo pipefail
W=${WORK:-/tmp/work-letterbox}
# shellcheck source=scripts/gpu_call_common.sh
source "$(dirname "$0")/gpu_call_common.sh" "$W"
trap 'finish; exit "${rc_tests:-1}"' EXIT    # the tests' status

say "gpu tests"
timeout -k 5 "${TESTS_S:-150}" $PY -m pytest -m gpu -q -s -p no:cacheprovider tests/test_gpu.py \
  -k "letterbox or demo_native_step" > "$R/pytest.log" 2>&1
rc_tests=$?
say "gpu tests rc $rc_tests: $(tail -1 "$R/pytest.log")"

[ -f $W/ckpt/config.json ] || run checkpoint 90 $PY -m quantize.realsize $W/ckpt || exit
[ -f $W/export/manifest.json ] || run export 90 $PY -m quantize export $W/ckpt $W/export --precision fp16 \
  --attention gqa --select-on-device --cache-len 4096 --device cuda || exit
[ -f $W/fused/manifest.json ] || run fuse 60 $PY -m quantize fuse $W/export $W/fused --target cuda || exit
[ -f $W/native/manifest.json ] || run native 60 $PY -m quantize native-step $W/fused $W/native || exit
[ -f $W/native8e/manifest.json ] || run native8e 60 $PY -m quantize native-step $W/fused $W/native8e \
  --weights int8 --embedding int8

bench() { local name=$1 art=$2 letterbox=$3 pre=$4
  [ -d $art ] && run bench_$name 60 env EDGEOCR_NATIVE_STEP=1 EDGEOCR_LETTERBOX=$letterbox $PY -m edgeocr bench $art \
    --device cuda --tokens 256 --repeats 2 --cuda-graph on --preprocess $pre --image "$IMG" --json "$R/bench_$name.json"; }
bench native_kernels $W/native kernels device
bench native_graph $W/native graph device
bench native_exact $W/native kernels exact
bench native8e_kernels $W/native8e kernels device
for art in native native8e; do
  [ -d $W/$art ] && run memory_$art 60 env EDGEOCR_NATIVE_STEP=1 $PY scripts/gpu_perf.py memory $W/$art \
    --config runtime --device cuda --tokens 256 --image "$IMG" --json "$R/memory_$art.json"
done
[ -d $W/native8e ] && run tokens_native8e 90 $PY scripts/native_step_tokens.py "$R/tokens_native8e.json" $W/native8e
exit "$rc_tests"
