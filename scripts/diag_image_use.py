"""How much a trained checkpoint uses the image: teacher-forced loss of its answers on held-out pages with
the page's own image, a blank page, and another page's image, for business documents (the eval generator
seed) and random-line reading pages (no template or language prior helps there).

    python scripts/diag_image_use.py CKPT [--pages 12] [--device cpu]

A model that reads has a much lower loss with the real image than with a blank or a swapped one on the
reading pages; one that only learned the templates does not.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch
    from tokenizers import Tokenizer
    from transformers import HunYuanVLForConditionalGeneration

    from edgeocr.preprocess import letterbox
    from quantize.docgen import GenOptions, make_document
    from quantize.tokenizer_build import special_ids
    from quantize.train import TASKS, TrainConfig, canvas_target, collate, reading_page

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--pages", type=int, default=12)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    ck = Path(args.checkpoint)
    model = HunYuanVLForConditionalGeneration.from_pretrained(str(ck), dtype=torch.float32).to(args.device).eval()
    tok = Tokenizer.from_file(str(ck / "tokenizer.json"))
    ids, cfg = special_ids(tok), TrainConfig()

    def docs(i):
        img, rec = make_document(i, 2002, GenOptions(degrade_prob=0.5))
        canvas, lb = letterbox(img)
        return canvas, rec, lb.scale

    def reading(i):
        canvas, rec = reading_page(i, 9090, 1.0)
        return canvas, rec, 1.0

    blank = np.full_like(docs(0)[0], 255)
    for name, make in (("business documents", docs), ("reading pages", reading)):
        pages = [make(i) for i in range(args.pages)]
        out = {}
        for cond in ("own image", "blank page", "another page's image"):
            losses = []
            for i, (canvas, rec, scale) in enumerate(pages):
                task = TASKS[i % len(TASKS)]
                img = {"own image": canvas, "blank page": blank,
                       "another page's image": pages[(i + 1) % len(pages)][0]}[cond]
                batch = [(img, task, canvas_target(rec, scale, task), None)]
                with torch.no_grad():
                    losses.append(float(model(**collate(batch, ids, tok, cfg, args.device)).loss))
            out[cond] = float(np.mean(losses))
        print(f"{name} ({args.pages} pages): " + ", ".join(f"{k} {v:.3f}" for k, v in out.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
