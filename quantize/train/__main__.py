"""Command line of the trainer (`python -m quantize train`, `python -m quantize.train`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

from quantize.train.config import TrainConfig, tiny


def parser() -> argparse.ArgumentParser:
    import quantize.train as pkg
    d = TrainConfig()
    ap = argparse.ArgumentParser(prog="python -m quantize train", description=pkg.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="run folder: checkpoint/, pool/, train_log.jsonl, run_summary.json")
    ap.add_argument("--init", type=Path, help="continue from this checkpoint (e.g. demo_model) instead of random weights")
    ap.add_argument("--tokenizer", type=Path, help="fresh model: this tokenizer.json instead of building one")
    ap.add_argument("--steps", type=int, help=f"optimizer steps (default {d.steps}; on --resume, the first "
                    "invocation's schedule)")
    ap.add_argument("--gpu-seconds", type=float, help="run the schedule on this many seconds of training")
    ap.add_argument("--budget-s", type=float, help="stop this invocation after S seconds, state saved")
    ap.add_argument("--resume", action="store_true", help="continue OUT/train_state.pt")
    ap.add_argument("--batch", type=int, default=d.batch, help=f"page views per step (default {d.batch})")
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--warmup", type=int, default=d.warmup)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--pool-pages", type=int, default=d.pool_pages, help=f"generated pages (default {d.pool_pages})")
    ap.add_argument("--pages", type=Path, action="append", default=[],
                    help="also a folder of labelled pages (images + labels.jsonl, calibration_data format); "
                    "repeatable")
    ap.add_argument("--data-seed", type=int, default=d.data_seed)
    ap.add_argument("--reading-frac", type=float, default=d.reading_frac,
                    help="share of random-line reading pages among the generated pages")
    ap.add_argument("--reading-level", default=None, metavar="LO[:HI]",
                    help="reading pages' difficulty, 0 (a few short lines in large type) to 1 (dense pages, the "
                    "default); LO:HI draws each page's level uniformly")
    ap.add_argument("--qk-gain", type=float, default=d.qk_gain,
                    help="multiply the decoder's query/key norm weights by this at the start (sharper attention)")
    ap.add_argument("--qk-gain-lr", type=float, default=d.qk_gain_lr,
                    help="learning-rate multiplier of the decoder's query/key norm weights")
    ap.add_argument("--pool-cache", type=Path, help="page pool cache folder (default OUT/pool)")
    ap.add_argument("--shifts", type=int, default=d.shifts, help="shifted placements per page")
    ap.add_argument("--augment", type=float, default=d.augment,
                    help="probability of each photometric augmentation per page view (0 = off)")
    ap.add_argument("--max-target-tokens", type=int,
                    help=f"longer targets are cut, without their end token (default {d.max_target_tokens}; the real "
                         "pages of `quantize htmldocs` reach about 1,500)")
    ap.add_argument("--glyph-loss", type=float, default=d.glyph_loss,
                    help="weight of the encoder's per-cell character loss (0 = off)")
    ap.add_argument("--workers", type=int, default=0, help="rendering processes (default: every core)")
    ap.add_argument("--eval-every", type=int, default=d.eval_every)
    ap.add_argument("--eval-images", type=int, default=d.eval_images)
    ap.add_argument("--log-every", type=int, default=d.log_every)
    ap.add_argument("--compile", action="store_true", help="torch.compile the forward")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--tiny", action="store_true", help="very small model sizes (tests, CPU measurements)")
    ap.add_argument("--print-pool-key", action="store_true",
                    help="print the page pool's fingerprint for these flags (what a cached pool is checked against; "
                         "its tokenizer from --init or --tokenizer) and exit")
    return ap


def _levels(text: str | None) -> tuple[float, float]:
    if text is None:
        return TrainConfig.reading_levels
    try:
        parts = [float(v) for v in text.split(":")]
    except ValueError:
        raise SystemExit(f"--reading-level {text!r}: expected LO or LO:HI, numbers in 0..1") from None
    lo, hi = parts[0], parts[-1]
    if len(parts) > 2 or not 0 <= lo <= hi <= 1:
        raise SystemExit(f"--reading-level {text!r}: expected LO or LO:HI with 0 <= LO <= HI <= 1")
    return lo, hi


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    for noisy in ("httpx", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    cfg = TrainConfig(steps=args.steps or TrainConfig.steps, batch=args.batch, lr=args.lr, warmup=args.warmup,
                      seed=args.seed, pool_pages=args.pool_pages, data_seed=args.data_seed,
                      reading_frac=args.reading_frac, reading_levels=_levels(args.reading_level),
                      qk_gain=args.qk_gain, qk_gain_lr=args.qk_gain_lr, shifts=args.shifts, augment=args.augment,
                      glyph_loss=args.glyph_loss, workers=args.workers or (os.cpu_count() or 1),
                      eval_every=args.eval_every, eval_images=args.eval_images, log_every=args.log_every)
    if args.max_target_tokens is not None and args.max_target_tokens < 16:
        raise SystemExit(f"--max-target-tokens {args.max_target_tokens}: expected at least 16")
    if args.tiny:
        cfg = tiny(cfg)
        cfg = replace(cfg, eval_images=min(cfg.eval_images, args.eval_images))
    if args.max_target_tokens:                   # over TrainConfig's and --tiny's own cut
        cfg = replace(cfg, max_target_tokens=args.max_target_tokens)
    from quantize.train.loop import RunOptions, pool_spec, train
    if args.print_pool_key:
        src = args.tokenizer or (args.init / "tokenizer.json" if args.init else None)
        if src is None:
            raise SystemExit("--print-pool-key needs --init CHECKPOINT or --tokenizer FILE (the key covers the "
                             "tokenizer the targets are written with)")
        from tokenizers import Tokenizer
        spec = pool_spec(cfg, RunOptions(page_dirs=tuple(str(p) for p in args.pages)))
        print(spec.fingerprint(Tokenizer.from_file(str(src)).to_str()))
        return 0
    train(args.out, cfg, RunOptions(
        device=args.device, resume=args.resume, init=args.init, tokenizer=args.tokenizer,
        gpu_seconds=args.gpu_seconds, budget_s=args.budget_s, page_dirs=tuple(str(p) for p in args.pages),
        compile=args.compile, pool_cache=args.pool_cache,
        steps_given=args.steps is not None or (not args.gpu_seconds and not args.resume)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
