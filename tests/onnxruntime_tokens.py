"""Greedy tokens of each artifact on the ONNX Runtime of the interpreter that runs this script, as JSON on stdout.

    python tests/onnxruntime_tokens.py PAGES TOKENS ARTIFACT...

Run by tests/test_oldest_onnxruntime.py with the oldest-ONNX-Runtime environment (.venv-ort-oldest, made by
scripts/setup.sh).  Each artifact gives {"tokens": [[...] per page]} or, when the runtime refuses it at load,
{"refused": message}; the version check is not bypassed."""

import json
import sys
from pathlib import Path

import onnxruntime

from edgeocr.dataset import load_dir
from edgeocr.decode import DecodeOptions
from edgeocr.errors import BackendError
from edgeocr.model import OCRModel

EVAL = Path(__file__).resolve().parents[1] / "calibration_data" / "eval"


def tokens(art: str, pages: int, n: int) -> dict:
    try:
        model = OCRModel(art, threads=1)
    except BackendError as e:
        return {"refused": str(e)}
    opts = DecodeOptions(max_new_tokens=n, repetition_penalty=1.0, ignore_stop=True)
    return {"tokens": [model.recognize(s.path, task="structured_parse", options=opts).token_ids
                       for s in load_dir(EVAL)[:pages]]}


if __name__ == "__main__":
    pages, n = int(sys.argv[1]), int(sys.argv[2])
    print(json.dumps({"onnxruntime": onnxruntime.__version__,
                      "artifacts": {a: tokens(a, pages, n) for a in sys.argv[3:]}}))
