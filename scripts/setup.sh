#!/usr/bin/env bash
# Set up a development/CI environment in .venv: CPU torch (pinned; a local wheel, else PyTorch's CPU index),
# edgeocr with its export, data, dev, peer and ray extras, the fonts the document generators render with,
# Chromium (the HTML document generator, the daemon's page test) and Tesseract (scripts/peer_compare.py); and
# .venv-ort-oldest: the oldest ONNX Runtime pyproject.toml allows (the newest patch of the `onnxruntime>=X.Y` pin's
# X.Y) with edgeocr's runtime dependencies only (no torch), for tests/test_oldest_onnxruntime.py.
#     scripts/setup.sh --ort-oldest    makes (or refreshes) only .venv-ort-oldest
#     scripts/setup.sh --demo          only what scripts/demo.sh needs: CPU torch and edgeocr's cpu, export, int8
#                                      and check extras in .venv (no system packages, no .venv-ort-oldest)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
ort_oldest() {
    local floor
    floor=$(grep -o '"onnxruntime>=[0-9.]*"' pyproject.toml | head -1 | tr -d '"' | cut -d= -f2)
    [ -n "$floor" ] || { echo "setup.sh: no \"onnxruntime>=X.Y\" pin in pyproject.toml" >&2; return 1; }
    [ -x .venv-ort-oldest/bin/python ] || "$PY" -m venv .venv-ort-oldest
    .venv-ort-oldest/bin/pip install -q "onnxruntime==$floor.*" -e . 2>&1 | grep -v "^WARNING: Location" || true
    .venv-ort-oldest/bin/python -c "import onnxruntime, edgeocr; print('.venv-ort-oldest: onnxruntime', onnxruntime.__version__)"
}
versions() {   # import what .venv must have (and the module $1 besides) and print the versions that count
    .venv/bin/python -c "import torch, transformers, onnxruntime, edgeocr${1:+, $1}; print('edgeocr', edgeocr.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__, '| onnxruntime', onnxruntime.__version__)"
}
if [ "${1:-}" = --ort-oldest ]; then ort_oldest; exit; fi
demo=; [ "${1:-}" = --demo ] && demo=1
if [ -n "${1:-}" ] && [ -z "$demo" ]; then echo "setup.sh: unknown option '$1' (--demo, --ort-oldest)" >&2; exit 2; fi
if [ -z "$demo" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    need=""
    fc-list 2>/dev/null | grep -qi "Noto Sans CJK" || need="$need fonts-noto-cjk fonts-wqy-microhei fonts-arphic-uming fonts-liberation2 fonts-dejavu-core fontconfig"
    command -v chromium >/dev/null || need="$need chromium"          # the daemon's web page test, quantize.htmldocs
    command -v systemd-analyze >/dev/null || need="$need systemd"    # unit file verification
    # scripts/peer_compare.py: Tesseract 5 with the Simplified Chinese and English models
    { command -v tesseract >/dev/null && tesseract --list-langs 2>/dev/null | grep -qx chi_sim; } \
        || need="$need tesseract-ocr tesseract-ocr-chi-sim tesseract-ocr-eng"
    if [ -n "$need" ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
    fi
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first, pinned, the CPU build: from a local wheel where pip's find-links has one, else from PyTorch's CPU
# index (PyPI's Linux torch is the CUDA build, several GB)
if .venv/bin/pip install -q --dry-run --no-deps --no-index torch==2.13.0 >/dev/null 2>&1; then
    .venv/bin/pip install -q torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
elif ! .venv/bin/pip install -q --timeout 30 --retries 1 torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu; then
    echo "setup.sh: torch 2.13.0 (CPU build) is neither in pip's find-links nor reachable on PyTorch's CPU index" \
         "(https://download.pytorch.org/whl/cpu): put its wheel where pip finds it, or install it first" >&2
    exit 1
fi
if [ -n "$demo" ]; then
    .venv/bin/pip install -q -e '.[cpu,export,int8,check]' 2>&1 | grep -v "^WARNING: Location" || true
    versions nncf
    exit
fi
.venv/bin/pip install -q -e '.[cpu,export,data,dev,peer,ray]' 2>&1 | grep -v "^WARNING: Location" || true
# rapidocr_onnxruntime requires opencv-python (the GUI build, which needs libGL); both it and the headless build
# provide cv2, so the headless one is written last
if .venv/bin/pip show -q opencv-python >/dev/null 2>&1; then
    v=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('opencv-python-headless'))")
    .venv/bin/pip install -q --force-reinstall --no-deps "opencv-python-headless==$v" 2>&1 | grep -v "^WARNING: Location" || true
fi
versions
ort_oldest
