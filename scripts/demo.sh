#!/usr/bin/env bash
# The main job on the embedded default: export the shipped demo model (demo_model/, a 7.8M-parameter
# HunyuanVL trained on synthetic business documents) to ONNX, build its INT8 artifact from the
# calibration images, read held-out eval documents with both (each model loaded once) and print what
# they read beside the ground truth.  Step output goes to build/demo.log; the terminal gets one line per
# step and the summary.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
LOG=build/demo.log
: >"$LOG"
step() {   # step "what" command...: run quietly into the log; on failure show the end of the log
    local what=$1 t0=$SECONDS
    shift
    printf '%-52s' "$what"
    if "$@" >>"$LOG" 2>&1; then
        echo "done ($((SECONDS - t0)) s)"
    else
        echo "FAILED"
        echo "--- last lines of $LOG:" >&2
        tail -n 40 "$LOG" >&2
        exit 1
    fi
}
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
step "setting up .venv (scripts/setup.sh --demo)" bash scripts/setup.sh --demo
PY=.venv/bin/python
# an artifact built before demo_model/ changed (a new model pulled) is built again, not read with the old weights
for a in build/demo-fp32 build/demo-int8; do
    [ -f "$a/manifest.json" ] || continue
    if ! $PY -c 'import json, sys; from pathlib import Path; from quantize.checkpoint import checkpoint_hash
sys.exit(json.loads(Path(sys.argv[1], "manifest.json").read_text())["source"]["sha256"] != checkpoint_hash(Path("demo_model")))' "$a" 2>>"$LOG"; then
        echo "$a was built from other demo_model/ weights: building it again"
        rm -rf "$a"
    fi
done
[ -f build/demo-fp32/manifest.json ] || step "exporting demo_model -> build/demo-fp32" \
    $PY -m quantize export demo_model build/demo-fp32 --cache-len 2048 --prefill-len 1280
[ -f build/demo-int8/manifest.json ] || step "calibrating INT8 -> build/demo-int8 (4-8 min)" \
    $PY -m quantize int8 demo_model build/demo-int8 --calib calibration_data/calib --cache-len 2048 --prefill-len 1280
step "reading 3 held-out pages with FP32 and INT8" \
    $PY -m edgeocr check --reference build/demo-fp32 --candidate build/demo-int8 --data calibration_data/eval \
    --limit 3 --task structured_parse --out build/demo-check --no-resume
$PY scripts/demo_summary.py build/demo-check.json build/demo-fp32 build/demo-int8
echo "(full log: $LOG)"
