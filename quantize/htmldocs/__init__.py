"""HTML/CSS business documents rendered by headless Chromium, with per-visual-line labels from the DOM.

    python -m quantize htmldocs OUT --count N --seed S [--workers W] [--kinds invoice,letter] [--clean]

A page source independent of the PIL generator (quantize.docgen): invoices, receipts, tables, forms,
letters, shipping notes, bank statements, notices and random-line reading pages, each with randomized
structure (grid / flex / table / multi-column), system fonts (via fontconfig), sizes, colours, paper and
content.  Writes OUT/NNNNNN.jpg (.webp with --image-format webp) and OUT/labels.jsonl in the calibration_data
format (see edgeocr.dataset); records also carry "source": "htmldocs".  The same seed gives the same labels, whatever
the number of workers.
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quantize.htmldocs.layouts import KINDS

log = logging.getLogger("edgeocr")

SOURCE = "htmldocs"
MAX_LONG_SIDE = 1600          # px: pages are laid out at most this tall (and at most 1240 wide)
MIN_LONG_SIDE = 1000          # px: and at least this tall
PAPER_ASPECT = (1.0, 1.414)   # page height / width drawn from this range, or the content's height if taller
RECEIPT_HEIGHT = (1000, 1600)  # px: receipt paper length (narrow pages)
DEGRADATIONS = ("lighting", "tint", "blur", "noise", "jpeg")


@dataclass(frozen=True)
class GenOptions:
    kinds: tuple[str, ...] = tuple(KINDS)   # drawn uniformly per page
    degrade: bool = True                     # photometric scan/photo effects (boxes stay exact)
    degrade_prob: float = 0.6                # share of pages that get effects
    jpeg_quality: int = 80                   # of the written file (JPEG or WebP)
    image_format: str = "jpeg"               # "jpeg" | "webp" (WebP: about 0.6x the bytes at a higher PSNR)
    max_long_side: int = MAX_LONG_SIDE
    targets: bool = True                     # precomputed HunyuanOCR target strings (derivable from "lines")


def _check_kinds(kinds) -> None:
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"unknown document kind(s) {bad}; known: {', '.join(KINDS)}")


def degrade(img: np.ndarray, rng) -> tuple[np.ndarray, list[str]]:
    """Photometric effects only (uneven light, colour cast, blur, noise, JPEG round trip): pixels never
    move, so the DOM's boxes stay exact.  Rotation and perspective are left out for that reason."""
    from PIL import Image, ImageFilter

    applied: list[str] = []
    h, w = img.shape[:2]
    a = img.astype(np.float32)
    if rng.random() < 0.5:
        gx, gy = rng.uniform(-0.2, 0.2, 2)
        xx = np.linspace(-1, 1, w, dtype=np.float32)[None, :]
        yy = np.linspace(-1, 1, h, dtype=np.float32)[:, None]
        a *= (1.0 + gx * xx + gy * yy - 0.12 * rng.random() * (xx ** 2 + yy ** 2))[..., None]
        applied.append("lighting")
    if rng.random() < 0.3:
        a = a * rng.uniform(0.9, 1.0, 3).astype(np.float32) + rng.uniform(0, 12, 3).astype(np.float32)
        applied.append("tint")
    out = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
    if rng.random() < 0.35:
        out = out.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.4, 1.0))))
        applied.append("blur")
    if rng.random() < 0.4:
        noise = rng.standard_normal((h, w), dtype=np.float32) * rng.uniform(2, 7)
        out = Image.fromarray(np.clip(np.asarray(out, np.float32) + noise[..., None], 0, 255).astype(np.uint8))
        applied.append("noise")
    if rng.random() < 0.4:
        b = io.BytesIO()
        out.save(b, "JPEG", quality=int(rng.integers(35, 75)))
        out = Image.open(io.BytesIO(b.getvalue())).convert("RGB")
        applied.append("jpeg")
    return np.asarray(out), applied


def make_page(renderer, index: int, seed: int, opts: GenOptions = GenOptions()):
    """Page `index` of the stream seeded by `seed`: (RGB uint8 array, label record without file name,
    renderer output).  `renderer` is a quantize.htmldocs.render.Renderer."""
    from quantize.docgen.core import Line, label_record
    from quantize.htmldocs.layouts import build, html_page

    _check_kinds(opts.kinds)
    rng = np.random.default_rng([seed, index, 0x48544D4C])
    kind = opts.kinds[int(rng.integers(len(opts.kinds)))]
    doc = build(kind, rng)
    paper = rng.uniform(*RECEIPT_HEIGHT) if doc.kind == "receipt" else doc.width * rng.uniform(*PAPER_ASPECT)
    doc.min_height = min(opts.max_long_side, max(doc.min_height, MIN_LONG_SIDE, int(paper)))   # or the content's height
    r = renderer.render(html_page(doc), doc.width, opts.max_long_side, doc.min_height)
    img, applied = r.image, []
    if opts.degrade and rng.random() < opts.degrade_prob:
        img, applied = degrade(img, np.random.default_rng([seed, index, 1]))
    h, w = img.shape[:2]
    shown = _squash("".join(ln.text for ln in r.lines))
    fields = {k: v for k, v in doc.fields.items() if v and _squash(v) in shown}    # only what is on the page
    rec = label_record(f"{SOURCE}-{seed}-{index:06d}", "", doc.kind, doc.lang, w, h,
                       [Line(ln.text, ln.box) for ln in r.lines], fields, applied, seed)
    rec["source"] = SOURCE
    if not opts.targets:
        del rec["targets"]
    return img, rec, r


def _squash(s: str) -> str:
    """Without whitespace: a value may wrap over lines."""
    return "".join(s.split())


IMAGE_FORMATS = {"jpeg": ".jpg", "webp": ".webp"}


def _encode(img: np.ndarray, quality: int, fmt: str = "jpeg") -> bytes:
    from PIL import Image
    b = io.BytesIO()
    if fmt == "webp":
        Image.fromarray(img).save(b, "WEBP", quality=quality, method=6)
    else:
        Image.fromarray(img).save(b, "JPEG", quality=quality, optimize=True, progressive=True)
    return b.getvalue()


def _render_share(out: str, indices: list[int], seed: int, opts: GenOptions, part: str | None,
                  progress=None) -> list[dict]:
    """Render `indices` in one browser, write their images; records go to `part` (a JSONL file) when
    given, else are returned."""
    from quantize.htmldocs.render import Renderer

    records = []
    with Renderer() as renderer:
        for i in indices:
            img, rec, _ = make_page(renderer, i, seed, opts)
            name = f"{i:06d}{IMAGE_FORMATS[opts.image_format]}"
            Path(out, name).write_bytes(_encode(img, opts.jpeg_quality, opts.image_format))
            rec["image"] = name
            records.append(rec)
            if progress is not None:
                progress(1)
    if part is not None:
        with open(part, "w", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(rec, ensure_ascii=False, sort_keys=True) + "\n")
    return records


def _worker(out, indices, seed, opts, part, queue) -> None:
    try:
        _render_share(out, indices, seed, opts, part, progress=lambda k: queue.put(k))
    except BaseException as e:           # reported to the parent, which raises
        queue.put(f"{type(e).__name__}: {e}")
        raise


def generate(out: Path, count: int, seed: int, opts: GenOptions = GenOptions(), workers: int = 1,
             start: int = 0, progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Write pages start..start+count-1 and labels.jsonl (atomically) into `out`, with `workers`
    browsers in parallel processes (page i goes to worker i mod W; output is the same for any W)."""
    from quantize.docgen import write_labels

    _check_kinds(opts.kinds)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    indices = list(range(start, start + count))
    workers = max(1, min(workers, count))
    done = 0

    def tick(k):
        nonlocal done
        done += k
        if progress:
            progress(done, count)

    log.info("htmldocs: pages %d..%d, seed %d, %d browser(s) -> %s", start, start + count - 1, seed, workers, out)
    if workers == 1:
        records = _render_share(str(out), indices, seed, opts, None, progress=tick)
    else:
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        parts = [str(out / f".part{w}.jsonl") for w in range(workers)]
        procs = [ctx.Process(target=_worker, args=(str(out), indices[w::workers], seed, opts, parts[w], queue))
                 for w in range(workers)]
        for p in procs:
            p.start()
        errors = []
        try:
            while done < count and not errors:
                try:
                    msg = queue.get(timeout=1.0)
                except Exception:
                    if not any(p.is_alive() for p in procs):
                        break
                    continue
                if isinstance(msg, str):
                    errors.append(msg)
                else:
                    tick(msg)
        finally:
            for p in procs:
                p.join(timeout=None if not errors else 5)
                if p.is_alive():
                    p.terminate()
                    p.join()
        if errors or any(p.exitcode for p in procs):
            for part in parts:
                Path(part).unlink(missing_ok=True)
            raise RuntimeError(f"htmldocs worker failed: {errors[0] if errors else 'exit code ' + str([p.exitcode for p in procs])}")
        records = []
        for part in parts:
            with open(part, encoding="utf-8") as f:
                records += [json.loads(line) for line in f]
            os.remove(part)
        records.sort(key=lambda r: r["image"])
    write_labels(out, records)
    return records


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    from edgeocr.errors import EdgeOCRError

    ap = argparse.ArgumentParser(prog="python -m quantize htmldocs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="output directory")
    ap.add_argument("--count", "-n", type=int, default=16, help="number of pages")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1, help="parallel browsers (processes)")
    ap.add_argument("--start", type=int, default=0, help="index of the first page (to extend a set)")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of: {', '.join(KINDS)}")
    ap.add_argument("--clean", action="store_true", help="no photometric degradations")
    ap.add_argument("--quality", "--jpeg-quality", dest="jpeg_quality", type=int, default=GenOptions.jpeg_quality,
                    help="quality of the written images, 1..95")
    ap.add_argument("--image-format", choices=sorted(IMAGE_FORMATS), default=GenOptions.image_format,
                    help="jpeg, or webp: measured on 12 clean 1,024-px pages (2026-12-05), WebP at quality 30 takes "
                         "23 KiB a page at 36.0 dB PSNR, JPEG at 30 37 KiB at 33.9 dB")
    ap.add_argument("--no-targets", action="store_true",
                    help='leave out "targets" (the HunyuanOCR output strings, derivable from "lines"): half the '
                         "size of labels.jsonl")
    ap.add_argument("--max-long-side", type=int, default=MAX_LONG_SIDE,
                    help=f"page height limit, px (>= {MIN_LONG_SIDE}; text below it is left out)")
    args = ap.parse_args(argv)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    if args.count < 1 or args.workers < 1:
        ap.error("--count and --workers must be >= 1")
    if args.max_long_side < MIN_LONG_SIDE or not 1 <= args.jpeg_quality <= 95:
        ap.error(f"--max-long-side must be >= {MIN_LONG_SIDE} and --quality in 1..95")
    opts = GenOptions(kinds=kinds, degrade=not args.clean, jpeg_quality=args.jpeg_quality,
                      max_long_side=args.max_long_side, targets=not args.no_targets, image_format=args.image_format)
    tty = sys.stderr.isatty()

    def prog(i, n):
        if tty or i == n or i % 50 == 0:
            print(f"\r{i}/{n} pages", end="" if tty and i < n else "\n", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        generate(args.out, args.count, args.seed, opts, workers=args.workers, start=args.start, progress=prog)
    except (EdgeOCRError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    dt = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    print(f"wrote {args.count} pages to {args.out} in {dt:.1f} s ({args.count / dt:.2f} pages/s with "
          f"{args.workers} worker(s), {size / 2**20:.1f} MiB)", file=sys.stderr)
    return 0
