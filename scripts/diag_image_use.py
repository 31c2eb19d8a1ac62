"""How much a trained checkpoint uses the image: teacher-forced loss of its answers on held-out pages with
the page's own image, a blank page, and another page's image, for business documents (the eval generator
seed) and random-line reading pages (no template or language prior helps there).

    python scripts/diag_image_use.py CKPT [--pages 12] [--device cpu] [--levels 1.0] [--json OUT.json]

A model that reads has a much lower loss with the real image than with a blank or a swapped one on the
reading pages; one that only learned the templates does not.  `--levels` picks the reading pages' difficulty
(quantize.train.pages.reading_page: 0 = a few short lines in large type, 1 = dense pages at 12-44 px); next
to each loss the teacher-forced next-token accuracy is printed.
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

    from quantize.tokenizer_build import special_ids
    from quantize.train.augment import to_pixels
    from quantize.train.batch import Prompts
    from quantize.train.config import TrainConfig
    from quantize.train.forward import IGNORE, BatchedHunYuanVL
    from quantize.train.pages import TASKS, Page, generated_page, reading_page, spotting_target

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--pages", type=int, default=12)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--levels", default="1.0", help="comma-separated reading-page levels (default 1.0)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    ck = Path(args.checkpoint)
    model = HunYuanVLForConditionalGeneration.from_pretrained(str(ck), dtype=torch.float32).to(args.device).eval()
    tok = Tokenizer.from_file(str(ck / "tokenizer.json"))
    ids, limit = special_ids(tok), TrainConfig().max_target_tokens
    fwd = BatchedHunYuanVL(model, image_start=0)
    pr = Prompts(tok, ids, fwd.geo.image_tokens, args.device)
    fwd = BatchedHunYuanVL(model, image_start=pr.image_start)

    def loss(canvas: np.ndarray, task: int, target: str) -> tuple[float, float]:
        """Teacher-forced answer loss and next-token accuracy of one page (the trainer's forward, no
        augmentation)."""
        p = pr.ids[task, :pr.lengths[task]].tolist()
        t = tok.encode(target).ids
        t = t[:limit] if len(t) > limit else t + [ids["eos_token_id"]]
        x = torch.tensor([p + t], device=args.device)
        lab = torch.tensor([[IGNORE] * len(p) + t], device=args.device)
        c = torch.from_numpy(canvas)[None].to(args.device)
        with torch.no_grad():
            o = fwd(x, lab, to_pixels(c, torch.zeros(1, 2, dtype=torch.int32, device=args.device), 0.0, None),
                    first=len(p) - 1)
        pred = o.logits[0, :-1].argmax(-1)                                 # predictions of the answer tokens
        acc = float((pred == torch.tensor(t, device=pred.device)).float().mean())
        return float(o.loss), acc

    def docs(i):
        g = generated_page(i, 2002, 0.0, 0.5)
        return g.canvas, g

    def reading(level):
        def make(i):
            canvas, rec = reading_page(i, 9090, level)
            return canvas, Page(canvas, rec["text"], tuple((ln["text"], tuple(ln["box"])) for ln in rec["lines"]))
        return make

    blank = np.full_like(docs(0)[0], 255)
    sets = [("business documents", docs)] + [(f"reading pages, level {lv:g}", reading(lv))
                                             for lv in (float(v) for v in args.levels.split(","))]
    report = {"checkpoint": str(ck), "pages": args.pages}
    for name, make in sets:
        pages = [make(i) for i in range(args.pages)]
        out = {}
        for cond in ("own image", "blank page", "another page's image"):
            got = []
            for i, (canvas, page) in enumerate(pages):
                task = i % len(TASKS)
                img = {"own image": canvas, "blank page": blank,
                       "another page's image": pages[(i + 1) % len(pages)][0]}[cond]
                got.append(loss(img, task, page.text if task == 0 else spotting_target(page)))
            out[cond] = {"loss": float(np.mean([g[0] for g in got])), "accuracy": float(np.mean([g[1] for g in got]))}
        report[name] = out
        print(f"{name} ({args.pages} pages): " + ", ".join(
            f"{k} {v['loss']:.3f} (acc {v['accuracy']:.3f})" for k, v in out.items()), flush=True)
    if args.json:
        import json
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
