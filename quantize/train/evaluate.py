"""Held-out evaluation of a checkpoint: full text of calibration_data/eval pages through the transformers
reference (the training log's eval_cer, scripts/eval_ckpt.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

EVAL_SETS = ("eval", "eval_html")       # held-out folders under calibration_data/


def eval_pages(model_dir: Path, n: int, tokens: int = 700, device: str | None = None,
               dtype: str | None = None, subset: str = "eval", batch: int = 1,
               folder: Path | None = None) -> list[dict]:
    """Full text of the first `n` pages of calibration_data/`subset` (eval or eval_html), or of any labelled page
    `folder` (e.g. pages a model trained on), through the transformers reference (greedy, the checkpoint's
    repetition penalty), `batch` pages per generate call (1: page by page): image, CER, tokens generated, text."""
    from edgeocr import metrics
    from edgeocr.dataset import load_dir
    from edgeocr.decode import DecodeOptions
    from quantize.reference import TransformersRunner

    if folder is not None:
        root = Path(folder)
        if not (root / "labels.jsonl").is_file() and not (root / "labels.csv").is_file():
            raise ValueError(f"{root}: no labels.jsonl or labels.csv (a labelled page folder is needed)")
    else:
        if subset not in EVAL_SETS:
            raise ValueError(f"evaluation set must be one of {EVAL_SETS}, not {subset!r}")
        root = Path(__file__).resolve().parents[2] / "calibration_data" / subset
        if not root.is_dir():
            raise ValueError(f"no evaluation set {subset!r}: {root} is not a folder")
    runner = TransformersRunner(str(model_dir), device or ("cuda" if _cuda() else "cpu"), dtype=dtype)
    rows, samples, opts = [], load_dir(root)[:n], DecodeOptions(max_new_tokens=tokens)
    for a in range(0, len(samples), max(1, batch)):
        group = samples[a:a + max(1, batch)]
        results = (runner.recognize_many([s.path for s in group], task="structured_parse", options=opts)
                   if len(group) > 1 else [runner.recognize(group[0].path, task="structured_parse", options=opts)])
        for s, r in zip(group, results):
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
