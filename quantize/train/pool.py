"""The page pool: every training page rendered once, stored uint8 on the training device.

Sources: `generated` pages of the document generator (quantize/docgen, with a share of random-line
reading pages), rendered on every host core, plus any folders of labelled pages in the calibration_data
format (`--pages DIR`).  Each page is letterboxed to the runtime's 1024x1024 canvas with
edgeocr.preprocess.  Its targets are tokenized once: the full text, and the spotting answer for each of
`1 + shifts` placements of the page on the canvas (variant 0 unshifted; the others seeded, within
+-max_shift pixels and never moving a labelled line off the canvas), so a shifted view's boxes stay exact
with no host work per step.  The characters' positions (glyph loss) are kept too.

The pool is cached in OUT/pool/ (canvases as one .npy file, the rest in meta.pt) under a fingerprint of
its recipe, so a resumed run loads it instead of rendering it again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing as mp
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from edgeocr.preprocess import CANVAS
from quantize.train import pages as P

log = logging.getLogger("quantize.train")

FULL_TEXT = 0                   # target row of the full text; row 1 + v is spotting under shift variant v


@dataclass(frozen=True)
class PoolSpec:
    generated: int              # generator pages
    data_seed: int              # generator seed
    reading_frac: float         # share of reading pages among the generated ones
    degrade_prob: float         # share of generated documents with scan/photo effects
    dirs: tuple[str, ...]       # folders of labelled pages (calibration_data format)
    shifts: int                 # shifted placements per page besides the unshifted one
    max_shift: int              # canvas pixels
    max_target_tokens: int      # longer targets are cut (no end token then)
    glyph_chars: int            # characters kept per page
    seed: int                   # shift draws
    reading_levels: tuple = (1.0, 1.0)   # reading pages' difficulty range (pages.reading_page's level)

    def fingerprint(self, tokenizer_json: str) -> str:
        h = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode())
        h.update(tokenizer_json.encode())
        return h.hexdigest()[:16]


@dataclass
class PagePool:
    canvases: "torch.Tensor"    # [N, S, S, 3] uint8, on the training device
    targets: "torch.Tensor"     # [N, 2 + shifts, T] int32 token ids (row 0 full text, 1 + v spotting)
    lengths: np.ndarray         # [N, 2 + shifts] int64 target lengths, on the host (batch lengths, no sync)
    shifts: "torch.Tensor"      # [N, 1 + shifts, 2] int32 (dx, dy) canvas pixels of each placement
    chars: "torch.Tensor"       # [N, glyph_chars, 3] int16 (x, y, class) in reading order; class -1 = none

    def __len__(self) -> int:
        return self.canvases.shape[0]


def _job(job):
    """Worker: ("gen", index, seed, reading_frac, degrade_prob, levels) or ("file", path, record) -> Page."""
    if job[0] == "gen":
        return P.generated_page(*job[1:])
    return P.labelled_page(job[1], job[2])


_OUT: np.ndarray | None = None       # the pool's canvas file while it is rendered, mapped before the workers fork


def _job_into(k_job) -> P.Page:
    """Worker: render page k into the shared canvas file; the Page comes back without its canvas (3 MiB a page
    through the result pipe, and one process copying all of them, was most of a pool's build time)."""
    k, job = k_job
    page = _job(job)
    _OUT[k] = page.canvas
    return replace(page, canvas=None)


def _placements(page: P.Page, n: int, max_shift: int, rng: np.random.Generator) -> np.ndarray:
    """[1 + n, 2] int32: (0, 0), then n seeded shifts that keep the page's lines on the canvas."""
    x0, x1, y0, y1 = P.shift_range(page, max_shift)
    out = np.zeros((1 + n, 2), np.int32)
    if n:
        out[1:, 0] = rng.integers(x0, x1 + 1, n) if x1 >= x0 else 0
        out[1:, 1] = rng.integers(y0, y1 + 1, n) if y1 >= y0 else 0
    return out


def _tokenize(texts: list[str], tok, limit: int, eos: int) -> list[list[int]]:
    out = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids = enc.ids
        out.append(ids[:limit] if len(ids) > limit else ids + [eos])     # a cut target gets no end token
    return out


def build_pool(spec: PoolSpec, tok, eos: int, cache: Path, device, workers: int = 0) -> PagePool:
    """Render (or load from `cache`) the pool of `spec` and move it to `device`."""
    import torch

    key = spec.fingerprint(tok.to_str())
    meta_path, canvas_path = cache / "meta.pt", cache / "canvases.npy"
    if meta_path.exists() and canvas_path.exists():
        meta = torch.load(meta_path, weights_only=False)
        if meta.get("fingerprint") == key:
            t = time.perf_counter()
            canv = np.load(canvas_path, mmap_mode="r")
            pool = _to_device(canv, meta, device)
            log.info("page pool: %d pages loaded from %s in %.0f s", len(pool), cache, time.perf_counter() - t)
            return pool
    jobs = [("gen", i, spec.data_seed, spec.reading_frac, spec.degrade_prob, tuple(spec.reading_levels))
            for i in range(spec.generated)]
    for d in spec.dirs:
        jobs += [("file", path, rec) for path, rec in P.labelled_records(Path(d))]
    if not jobs:
        raise ValueError("the page pool is empty: give generated pages (--pool-pages) or --pages DIR")
    n, limit = len(jobs), spec.max_target_tokens
    cache.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)           # written last: a render cut short leaves no pool that loads
    canv = np.lib.format.open_memmap(canvas_path, mode="w+", dtype=np.uint8, shape=(n, CANVAS, CANVAS, 3))
    chars = np.zeros((n, spec.glyph_chars, 3), np.int16)
    shifts = np.zeros((n, 1 + spec.shifts, 2), np.int32)
    texts: list[str] = []
    rng = np.random.default_rng([spec.seed, 23, 1])     # the generator's page k draws from [seed, k]
    workers = workers or os.cpu_count() or 1
    t = time.perf_counter()
    ctx = mp.get_context("fork")
    global _OUT
    _OUT = canv                                  # a shared file mapping: the forked workers write into it
    try:
        with ctx.Pool(workers) if workers > 1 else _Inline() as procs:
            for k, page in enumerate(procs.imap(_job_into, enumerate(jobs), chunksize=4)):
                chars[k] = P.char_points(page, spec.glyph_chars)
                shifts[k] = _placements(page, spec.shifts, spec.max_shift, rng)
                texts.append(page.text)
                texts += [P.spotting_target(page, tuple(s)) for s in shifts[k]]
                if (k + 1) % 1024 == 0:
                    log.info("page pool: %d / %d pages rendered (%.0f s)", k + 1, n, time.perf_counter() - t)
    finally:
        _OUT = None
    canv.flush()
    rows = 2 + spec.shifts
    ids = _tokenize(texts, tok, limit, eos)
    targets = np.zeros((n * rows, limit + 1), np.int32)
    lengths = np.fromiter((len(x) for x in ids), np.int64, n * rows)
    for r, x in enumerate(ids):
        targets[r, :len(x)] = x
    meta = {"fingerprint": key, "spec": asdict(spec), "targets": targets.reshape(n, rows, -1),
            "lengths": lengths.reshape(n, rows), "shifts": shifts, "chars": chars}
    torch.save(meta, meta_path)
    log.info("page pool: %d pages (%d generated, %d from folders) rendered on %d processes in %.0f s",
             n, spec.generated, n - spec.generated, workers, time.perf_counter() - t)
    return _to_device(canv, meta, device)


def _to_device(canv: np.ndarray, meta: dict, device) -> PagePool:
    import torch

    n = canv.shape[0]
    out = torch.empty((n, *canv.shape[1:]), dtype=torch.uint8, device=device)
    for a in range(0, n, 256):                   # in chunks: host memory stays small
        out[a:a + 256].copy_(torch.from_numpy(np.array(canv[a:a + 256])))
    return PagePool(canvases=out, targets=torch.from_numpy(meta["targets"]).to(device),
                    lengths=np.asarray(meta["lengths"]), shifts=torch.from_numpy(meta["shifts"]).to(device),
                    chars=torch.from_numpy(meta["chars"]).to(device))


class _Inline:
    """A single-process stand-in for multiprocessing.Pool (workers=1)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @staticmethod
    def imap(fn, jobs, chunksize=1):
        return map(fn, jobs)
