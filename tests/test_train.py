"""The training script at toy size on CPU: runs, logs, resumes, and its checkpoint exports and runs."""

from __future__ import annotations

import json
import subprocess
import sys

from edgeocr.decode import DecodeOptions
from edgeocr.model import OCRModel


def _train(out, steps, *extra):
    r = subprocess.run([sys.executable, "-m", "quantize.train", str(out), "--tiny", "--steps", str(steps), "--batch", "2",
                        "--workers", "2", "--eval-every", "0", "--device", "cpu", *extra],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_train_resume_export_run(tmp_path):
    out = tmp_path / "run"
    _train(out, 2)
    r = _train(out, 3, "--resume", "--budget-s", "0")       # a time-limited invocation stops with state saved
    assert "budget of 0 s reached at step 2" in r.stderr
    r = _train(out, 3, "--resume")
    assert "resumed at step 2" in r.stderr
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log] == [1, 2, 3] and all(x["loss"] > 0 for x in log)
    ck = out / "checkpoint"
    art = tmp_path / "art"
    subprocess.run([sys.executable, "-m", "quantize", "export", str(ck), str(art), "--max-cache-len", "1280",
                    "--max-prefill-len", "1200"], check=True, capture_output=True, timeout=600)
    res = OCRModel(art).recognize(_page(tmp_path),
                                  options=DecodeOptions(max_new_tokens=3))
    assert res.generated_tokens >= 1


def _page(tmp_path):
    from quantize.docgen import GenOptions, make_document
    img, _ = make_document(0, 5, GenOptions(degrade=False))
    p = tmp_path / "page.png"
    img.save(p)
    return p
