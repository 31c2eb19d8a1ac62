"""The real HunyuanOCR architecture on random weights: exports, loads and runs (slow: pytest -m slow).

Set EDGEOCR_REALSIZE_DIR to keep the checkpoint and artifact between runs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from conftest import make_image
from edgeocr.decode import DecodeOptions

pytestmark = pytest.mark.slow


def test_realsize_export_load_run(tmp_path):
    from quantize.export import ExportOptions, export
    from quantize.realsize import make_realsize_checkpoint

    from edgeocr.model import OCRModel

    base = Path(os.environ.get("EDGEOCR_REALSIZE_DIR", tmp_path))
    ckpt, art = base / "real-ckpt", base / "real-fp32"
    if not (ckpt / "config.json").exists():
        make_realsize_checkpoint(ckpt)
    t0 = time.perf_counter()
    if not (art / "manifest.json").exists():
        export(ckpt, art, ExportOptions(cache_len=4096))
    m = json.loads((art / "manifest.json").read_text())
    sizes = {k: v["bytes"] for k, v in m["files"].items()}
    print(f"\nexport {time.perf_counter() - t0:.0f} s; sizes MiB:",
          {k: round(v / 2**20, 1) for k, v in sizes.items()})
    assert m["model"]["text"]["vocab_size"] == 120818 and m["preprocess"]["n_image_tokens"] == 1058
    assert m["kv_cache"]["bytes_per_token"] == 24 * 2 * 8 * 128 * 4
    # tied embedding once: 539,010,048 LLM params in FP32
    assert 539_010_048 * 4 * 0.99 < sizes["decoder.onnx.data"] < 539_010_048 * 4 * 1.01
    assert 457_198_064 * 4 * 0.95 < sizes["vision.onnx.data"] < 457_198_064 * 4 * 1.01
    model = OCRModel(art)
    r = model.recognize(make_image(0), task="spotting", options=DecodeOptions(max_new_tokens=3))
    print("timings ms:", {k: round(v, 1) for k, v in r.timings_ms.items()})
    assert r.prompt_tokens > 1058 and r.generated_tokens == 3
