"""Held-out evaluation of a checkpoint: full text of calibration_data/eval pages through the transformers
reference (the training log's eval_cer, scripts/eval_ckpt.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

EVAL_SETS = ("eval", "eval_html")       # held-out folders under calibration_data/


def eval_pages(model_dir: Path, n: int, tokens: int = 700, device: str | None = None,
               dtype: str | None = None, subset: str = "eval") -> list[dict]:
    """Full text of the first `n` pages of calibration_data/`subset` (eval or eval_html) through the transformers
    reference (greedy, the checkpoint's repetition penalty), page by page: image, CER, tokens generated, text."""
    from edgeocr import metrics
    from edgeocr.dataset import load_dir
    from edgeocr.decode import DecodeOptions
    from quantize.reference import TransformersRunner

    if subset not in EVAL_SETS:
        raise ValueError(f"evaluation set must be one of {EVAL_SETS}, not {subset!r}")
    root = Path(__file__).resolve().parents[2] / "calibration_data" / subset
    if not root.is_dir():
        raise ValueError(f"no evaluation set {subset!r}: {root} is not a folder")
    runner = TransformersRunner(str(model_dir), device or ("cuda" if _cuda() else "cpu"), dtype=dtype)
    rows = []
    for s in load_dir(root)[:n]:
        r = runner.recognize(s.path, task="structured_parse", options=DecodeOptions(max_new_tokens=tokens))
        rows.append({"image": s.path.name, "cer": metrics.cer(r.text, s.text), "tokens": r.generated_tokens,
                     "text": r.text})
    return rows


def evaluate(model_dir: Path, n: int, tokens: int = 700) -> dict:
    """Mean CER of the current checkpoint on calibration_data/eval (the training log's eval_cer)."""
    cers = [r["cer"] for r in eval_pages(model_dir, n, tokens)]
    return {"eval_cer": float(np.mean(cers)), "eval_images": len(cers)}


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()
