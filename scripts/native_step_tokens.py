"""Tokens of a native-step artifact's own decode step against ONNX Runtime's step on the same artifact (the same
weights and prefill), two eval pages of 64 spotting tokens past the end token; used by scripts/gpu_native_step.sh
and scripts/gpu_letterbox.sh.

    python scripts/native_step_tokens.py OUT.json ARTIFACT [DEVICE [NATIVE]]    # DEVICE cuda, NATIVE 1 (numpy: twins)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from edgeocr.dataset import load_dir
from edgeocr.decode import DecodeOptions
from edgeocr.model import OCRModel


def main(argv: list[str]) -> int:
    out, art = argv[:2]
    dev = argv[2] if len(argv) > 2 else "cuda"
    native = argv[3] if len(argv) > 3 else "1"
    pages = load_dir(Path(__file__).resolve().parents[1] / "calibration_data" / "eval")[:2]
    o = DecodeOptions(max_new_tokens=64, ignore_stop=True)
    runs = {}
    for mode in (native, "0"):
        os.environ["EDGEOCR_NATIVE_STEP"] = mode
        m = OCRModel(art, device=dev)
        runs[m.session.engine] = [m.recognize(p.path, task="spotting", options=o).token_ids for p in pages]
    (a, ta), (b, tb) = runs.items()
    res = {"engines": [a, b], "identical": ta == tb,
           "first_divergence": [next((i for i, (x, y) in enumerate(zip(t, u)) if x != y), None)
                                for t, u in zip(ta, tb)]}
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(res)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
