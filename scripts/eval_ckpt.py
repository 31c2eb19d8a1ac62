"""CER of transformers checkpoints on the first N pages of calibration_data/eval (or --set eval_html): full text,
greedy with the checkpoint's repetition penalty, page by page, through the transformers reference (no export):

    python scripts/eval_ckpt.py CKPT [CKPT ...] [--pages 16] [--tokens 800] [--device cuda] [--dtype float32]
        [--set eval|eval_html | --dir PAGES] [--batch 8]

--dir measures any labelled page folder instead (e.g. pages a checkpoint trained on, beside held-out ones).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantize.train import eval_pages  # noqa: E402
from quantize.train.evaluate import EVAL_SETS  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--pages", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=800)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--set", default="eval", choices=EVAL_SETS, help="calibration_data subfolder")
    ap.add_argument("--dir", type=Path, help="a labelled page folder to measure instead of --set")
    ap.add_argument("--batch", type=int, default=1, help="pages per generate call (1: page by page)")
    ap.add_argument("--json", type=Path, help="write the per-page results here")
    args = ap.parse_args()
    report = {}
    for ck in args.checkpoints:
        t0 = time.perf_counter()
        rows = eval_pages(Path(ck), args.pages, args.tokens, args.device, args.dtype, args.set, args.batch, args.dir)
        cers = [x["cer"] for x in rows]
        report[ck] = {"mean_cer": float(np.mean(cers)), "median_cer": float(np.median(cers)), "pages": rows}
        where = args.dir or args.set
        print(f"{ck}: mean CER {np.mean(cers):.4f}, median {np.median(cers):.4f} on {len(cers)} {where} pages "
              f"({time.perf_counter() - t0:.0f} s); per page " + " ".join(f"{c:.2f}" for c in cers), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
