#!/usr/bin/env bash
# The main job on the embedded default: export the shipped demo model (demo_model/, a 5.9M-parameter
# HunyuanVL trained on synthetic business documents) to ONNX, build its INT8 artifact from the
# calibration images, and read held-out eval documents with the torch-free runtime.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=.venv/bin/python
mkdir -p build
[ -f build/demo-fp32/manifest.json ] || $PY -m quantize export demo_model build/demo-fp32 --cache-len 2048 --prefill-len 1280
[ -f build/demo-int8/manifest.json ] || $PY -m quantize int8 demo_model build/demo-int8 \
    --calib calibration_data/calib --cache-len 2048 --prefill-len 1280
for img in 000000 000002 000003; do
  echo "== calibration_data/eval/$img.jpg (INT8) =="
  .venv/bin/edgeocr run calibration_data/eval/$img.jpg --model build/demo-int8 --task structured_parse
done
