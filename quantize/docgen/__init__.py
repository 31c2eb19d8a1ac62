"""Synthetic business documents with exact ground truth (calibration, accuracy checks, training).

    python -m quantize.docgen --out DIR -n 128 --seed 1 [--kinds receipt,table] [--clean]

Writes DIR/NNNNNN.jpg (or .png with --png) and DIR/labels.jsonl (one record per image, see
edgeocr.dataset for the schema).  The same seed gives byte-identical labels.
"""

from __future__ import annotations

import io
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quantize.docgen.core import degrade, label_record
from quantize.docgen.fonts import discover
from quantize.docgen.layouts import KINDS

log = logging.getLogger("edgeocr.docgen")


@dataclass(frozen=True)
class GenOptions:
    kinds: tuple[str, ...] = tuple(KINDS)     # document kinds to draw from, uniformly
    degrade: bool = True                      # apply scan/photo effects
    degrade_prob: float = 0.7                 # share of documents that get effects
    max_side: int = 1280                      # downscale pages whose longer side exceeds this, pixels
    image_format: str = "jpg"                 # "jpg" (quality 85) or "png"
    jpeg_quality: int = 85


def make_document(index: int, seed: int, opts: GenOptions = GenOptions()):
    """Document `index` of the stream seeded by `seed`: returns (PIL image, label record without file name)."""
    from PIL import Image

    from quantize.docgen.core import Line

    for k in opts.kinds:
        if k not in KINDS:
            raise ValueError(f"unknown document kind {k!r}; known: {', '.join(KINDS)}")
    rng = np.random.default_rng([seed, index])
    kind = opts.kinds[int(rng.integers(len(opts.kinds)))]
    page, kind, lang = KINDS[kind](discover(), rng)
    img, lines = page.img, page.lines
    scale = min(1.0, opts.max_side / max(img.size))
    if scale < 1.0:
        nw, nh = round(img.width * scale), round(img.height * scale)
        img = img.resize((nw, nh), Image.LANCZOS)
        lines = [Line(ln.text, (int(ln.box[0] * scale), int(ln.box[1] * scale),
                                min(nw, int(np.ceil(ln.box[2] * scale))), min(nh, int(np.ceil(ln.box[3] * scale)))))
                 for ln in lines]
    applied: list[str] = []
    if opts.degrade and rng.random() < opts.degrade_prob:
        img, lines, applied = degrade(img, lines, rng)
    rec = label_record(f"{seed}-{index:06d}", "", kind, lang, img.width, img.height, lines, page.fields,
                       applied, seed)
    return img, rec


def encode(img, opts: GenOptions) -> bytes:
    b = io.BytesIO()
    if opts.image_format == "png":
        img.save(b, "PNG", optimize=False)
    else:
        img.save(b, "JPEG", quality=opts.jpeg_quality, optimize=True)
    return b.getvalue()


def generate(out: Path, n: int, seed: int, opts: GenOptions = GenOptions(), start: int = 0,
             progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Write n documents and labels.jsonl (atomically) into `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(start, start + n):
        img, rec = make_document(i, seed, opts)
        name = f"{i:06d}.{opts.image_format}"
        (out / name).write_bytes(encode(img, opts))
        rec["image"] = name
        records.append(rec)
        if progress:
            progress(i - start + 1, n)
    write_labels(out, records)
    return records


def write_labels(out: Path, records: list[dict]) -> None:
    """out/labels.jsonl, one record per line, replaced atomically (readable by a daemon user)."""
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".labels.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, out / "labels.jsonl")


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m quantize.docgen", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="output directory")
    ap.add_argument("-n", type=int, default=16, help="number of documents")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of: {', '.join(KINDS)}")
    ap.add_argument("--clean", action="store_true", help="no scan/photo degradations")
    ap.add_argument("--png", action="store_true", help="write PNG instead of JPEG")
    ap.add_argument("--max-side", type=int, default=1280)
    ap.add_argument("--fonts", action="store_true", help="report fonts found and missing, then exit")
    ap.add_argument("--subset-fonts", type=Path, metavar="DIR",
                    help="write the found faces cut to the generator's characters into DIR (a flat folder to "
                         "carry to a machine without apt; use it there with EDGEOCR_FONT_DIR=DIR), then exit")
    args = ap.parse_args(argv)
    if not args.out and not args.fonts and not args.subset_fonts:
        ap.error("--out is required")
    from quantize.docgen.fonts import FontsMissing
    try:
        fs = discover()
    except FontsMissing as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(fs.report(), file=sys.stderr)
    if args.fonts:
        return 0
    if args.subset_fonts:
        from quantize.docgen.fonts import subset_fonts
        written = subset_fonts(str(args.subset_fonts), fs)
        for name, size, cut in written:
            how = "subset" if cut else "whole (its subset renders differently)"
            print(f"{name}: {size / 1024:.0f} KiB, {how}", file=sys.stderr)
        total = sum(os.path.getsize(p) for p in args.subset_fonts.iterdir())
        print(f"wrote {len(written)} faces ({total / 2**20:.1f} MiB) to {args.subset_fonts}", file=sys.stderr)
        return 0
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        print(f"error: unknown kind(s) {bad}; known: {', '.join(KINDS)}", file=sys.stderr)
        return 2
    opts = GenOptions(kinds=kinds, degrade=not args.clean, max_side=args.max_side,
                      image_format="png" if args.png else "jpg")
    t0 = time.perf_counter()
    tty = sys.stderr.isatty()

    def prog(i, n):
        if tty or i == n or i % 50 == 0:
            print(f"\r{i}/{n} documents", end="" if tty and i < n else "\n", file=sys.stderr, flush=True)

    generate(args.out, args.n, args.seed, opts, progress=prog)
    dt = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"wrote {args.n} documents to {args.out} in {dt:.1f} s ({args.n / dt:.1f} docs/s, "
          f"{size / 2**20:.1f} MiB)", file=sys.stderr)
    return 0
