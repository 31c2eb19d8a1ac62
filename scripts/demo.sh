#!/usr/bin/env bash
# The main job on the embedded default: build the default checkpoint, export it to an ONNX artifact,
# and read the shipped eval documents with the torch-free runtime.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=.venv/bin/python
mkdir -p build
[ -f build/default-ckpt/config.json ] || $PY -m quantize tiny build/default-ckpt --config tiny-a --seed 1
[ -f build/default/manifest.json ] || $PY -m quantize export build/default-ckpt build/default --max-cache-len 1536 --max-prefill-len 1400
.venv/bin/edgeocr run calibration_data/eval/000000.jpg calibration_data/eval/000001.jpg calibration_data/eval/000002.jpg \
    --model build/default --task spotting --max-new-tokens 32
