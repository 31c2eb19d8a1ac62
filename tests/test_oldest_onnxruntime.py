"""The demo artifacts of every flavour on the oldest ONNX Runtime pyproject.toml allows, beside the newest.

The old runtime lives in its own runtime-only environment, .venv-ort-oldest (made by scripts/setup.sh); the same
script (tests/onnxruntime_tokens.py) decodes with both interpreters."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from edgeocr.artifact import _version

ROOT = Path(__file__).resolve().parents[1]
OLD_PY = ROOT / ".venv-ort-oldest" / "bin" / "python"
SCRIPT = Path(__file__).with_name("onnxruntime_tokens.py")
PAGES, TOKENS = 3, 40                   # eval pages, greedy tokens a page


def pinned_floor() -> str:
    """'1.20': the X.Y of pyproject.toml's `onnxruntime>=X.Y` (the cpu extra)."""
    m = re.search(r'"onnxruntime>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert m, "pyproject.toml has no \"onnxruntime>=X.Y\" pin"
    return m.group(1)


def _tokens(python, arts) -> dict:
    r = subprocess.run([str(python), str(SCRIPT), str(PAGES), str(TOKENS), *map(str, arts)], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_demo_artifacts_on_the_oldest_onnxruntime(demo_arts):
    """FP32 masked and FP32 GroupQueryAttention + selection in the graph (fused, portable) give exactly the tokens
    they give on the newest ONNX Runtime; the CPU 8-bit artifact (8-bit MatMulNBits) is refused at load with its
    manifest's message."""
    floor = pinned_floor()
    assert OLD_PY.exists(), (
        f"{OLD_PY.parent.parent} is missing: CI runs the demo artifacts on the oldest ONNX Runtime the pins allow "
        f"(onnxruntime {floor}.x) from that environment; make it with `bash scripts/setup.sh --ort-oldest` "
        "(scripts/setup.sh makes it too)")
    arts = {k: str(demo_arts[k]) for k in ("masked", "fp32", "cpu8")}
    old = _tokens(OLD_PY, arts.values())
    new = _tokens(sys.executable, arts.values())
    assert _version(old["onnxruntime"])[:2] == _version(floor)[:2], (old["onnxruntime"], floor)
    assert _version(new["onnxruntime"]) > _version(old["onnxruntime"])
    for k in ("masked", "fp32"):
        a, b = old["artifacts"][arts[k]], new["artifacts"][arts[k]]
        assert "tokens" in a, (k, a)
        assert len(a["tokens"]) == PAGES and all(len(t) == TOKENS for t in a["tokens"]), k
        assert a["tokens"] == b["tokens"], (k, old["onnxruntime"], new["onnxruntime"])
    refused = old["artifacts"][arts["cpu8"]].get("refused", "")
    assert "needs ONNX Runtime >= 1.23.0 (8-bit MatMulNBits" in refused, refused
    assert f"this one is {old['onnxruntime']}" in refused, refused
    assert len(new["artifacts"][arts["cpu8"]]["tokens"]) == PAGES      # the newest runs it
