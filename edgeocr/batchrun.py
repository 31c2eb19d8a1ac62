"""Batch recognition for `edgeocr run`: pages in, one outcome per page out, and the JSONL file behind
`--out` / `--resume`.

    done = prepare_output("out.jsonl", resume=True)           # keys of pages already written
    with PageLoader() as loader, JsonlWriter("out.jsonl") as out:
        run_pages(model, [r for r in refs if r.key not in done], loader,
                  lambda o: out.write(o.record()), task="spotting")

Pages are read and prepared on the model's worker pool (a bad file becomes an error outcome, the rest go on)
and fed lazily to `OCRModel.recognize_many`, which may finish them out of input order.  The JSONL file holds one line per
page, each written whole and flushed as its page finishes; `--resume` skips pages that have a line
without an error, retries the others, and drops an unterminated last line left by a hard kill.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


from edgeocr.decode import DecodeOptions
from edgeocr.errors import EdgeOCRError
from edgeocr.pages import PageLoader, PageRef

log = logging.getLogger("edgeocr")

class OutputError(EdgeOCRError):
    """The --out file exists without --resume/--overwrite, or is not a JSONL file this tool can resume."""


# ---------------------------------------------------------------------------------------------- outcomes
@dataclass(frozen=True)
class PageOutcome:
    """What became of one page."""

    ref: PageRef                     # which file / page
    result: object | None = None     # OCRResult when recognized
    error: EdgeOCRError | None = None   # why the page could not be loaded; None when recognized
    load_ms: float = 0.0             # reading + decoding the file (or rasterizing the PDF page), ms

    @property
    def ok(self) -> bool:
        return self.error is None

    def record(self) -> dict:
        """The JSONL line: {file, page, text, lines, finish_reason, timings_ms, ...} or {file, page, error}."""
        head = {"file": self.ref.file, "page": self.ref.page}
        if self.error is not None:
            return {**head, "error": {"type": type(self.error).__name__, "message": str(self.error)}}
        d = self.result.to_dict()                  # an OCRResult, or a daemon's reply (edgeocr run --remote)
        d["timings_ms"]["load"] = round(self.load_ms, 3)
        return {**head, **d}


# ---------------------------------------------------------------------------------------------- running
def run_pages(model, refs: Iterable[PageRef], loader: PageLoader, on_page: Callable[[PageOutcome], None],
              task: str | None = None, prompt: str | None = None, lang: str = "zh",
              options: DecodeOptions = DecodeOptions(), stop: threading.Event | None = None) -> None:
    """Recognize `refs` through `model.recognize_many`, calling on_page once per page as it finishes or fails
    to load.  Each page is read and prepared on the model's worker pool (`model.workers`, ahead of need: an
    image file goes to the preparer as a path, checked against the model's pixel limit, so the fast path
    decodes a JPEG at reduced scale); a page that fails becomes an error outcome and the rest go on.  When
    `stop` is set, no further page is fed; pages already handed to the model still finish.  on_page may be
    called from the thread that pulls pages."""
    fed: dict[int, tuple[PageRef, float]] = {}        # index given to the model -> (page, load ms)

    def load(ref: PageRef):
        """(Prepared or None, load ms: reading + decoding or rasterizing, error or None), on the worker."""
        t0 = time.perf_counter()
        try:
            source = loader.source(ref)                 # an image file's path, or a rendered PDF page
            t1 = time.perf_counter()
            prep = model.prepare(source)
        except EdgeOCRError as e:
            return None, (time.perf_counter() - t0) * 1e3, e
        return prep, (t1 - t0) * 1e3 + prep.timings_ms.get("load", 0.0), None

    def feed() -> Iterator:
        i = 0
        for ref, fut in model.workers.ahead(refs, load, depth=model.slots):
            if stop is not None and stop.is_set():
                return
            prep, ms, error = fut.result()
            if error is not None:
                on_page(PageOutcome(ref, error=error, load_ms=ms))
                continue
            fed[i] = (ref, ms)
            i += 1
            yield prep

    for i, result in model.recognize_many(feed(), task=task, prompt=prompt, lang=lang, options=options):
        ref, load_ms = fed.pop(i)
        on_page(PageOutcome(ref, result=result, load_ms=load_ms))


# ---------------------------------------------------------------------------------------------- JSONL
@dataclass(frozen=True)
class ResumeState:
    """What an existing --out file already holds."""

    done: frozenset               # keys (file, page) of lines without an error
    kept: int                     # lines kept (recognized pages)
    retried: int                  # error lines dropped (their pages are run again when still among the inputs)
    partial_bytes: int            # bytes of an unterminated last line dropped (hard kill mid-write)
    failed: frozenset = frozenset()   # keys (file, page) of the error lines dropped


def prepare_output(path: str | Path, resume: bool = False, overwrite: bool = False) -> ResumeState:
    """Make `path` ready for appending.  A missing or empty file starts empty; an existing one needs
    `resume` (keep its recognized pages, drop error lines and an unterminated last line) or `overwrite`."""
    path = Path(path)
    empty = ResumeState(frozenset(), 0, 0, 0)
    if path.is_dir():
        raise OutputError(f"--out {path}: is a directory")
    if not path.parent.is_dir():
        raise OutputError(f"--out {path}: folder {path.parent} does not exist")
    if not path.exists() or path.stat().st_size == 0:
        return empty
    if overwrite:
        path.write_bytes(b"")
        return empty
    if not resume:
        raise OutputError(f"--out {path} already exists: pass --resume to continue it or --overwrite to start over")
    return _resume(path)


def _resume(path: Path) -> ResumeState:
    data = path.read_bytes()
    body, _, partial = data.rpartition(b"\n")         # partial: what follows the last newline
    kept_lines, done, failed, retried = [], set(), set(), 0
    for n, raw in enumerate(body.split(b"\n") if body else [], 1):
        if not raw.strip():
            continue
        rec = _parse_line(path, n, raw)
        if "error" in rec:
            retried += 1
            failed.add((rec["file"], rec.get("page")))
            continue
        kept_lines.append(raw)
        done.add((rec["file"], rec.get("page")))
    if retried or partial:
        tmp = path.with_name(path.name + ".resume-tmp")
        tmp.write_bytes(b"".join(line + b"\n" for line in kept_lines))
        os.replace(tmp, path)
    if partial:
        log.warning("%s: dropped an unterminated last line (%d bytes)", path, len(partial))
    return ResumeState(frozenset(done), len(kept_lines), retried, len(partial), frozenset(failed - done))


def _parse_line(path: Path, n: int, raw: bytes) -> dict:
    try:
        rec = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        rec = None
    if not isinstance(rec, dict) or not isinstance(rec.get("file"), str):
        raise OutputError(f"--out {path} line {n} is not an `edgeocr run` JSON line with a \"file\"; "
                          f"not resuming over it (use --overwrite to start over)")
    return rec


class JsonlWriter:
    """Appends one JSON object per line; each line is written whole and flushed.  Thread-safe.  Closing
    after an interrupted write truncates the file back to its last complete line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._f = open(self.path, "ab")
        except OSError as e:
            raise OutputError(f"--out {path}: cannot be written ({e.strerror or e})") from None
        self._end = self._f.seek(0, os.SEEK_END)    # file offset just past the last complete line
        self._lock = threading.Lock()
        self.lines = 0                               # lines written by this writer

    def write(self, record: dict) -> None:
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        with self._lock:
            self._f.write(data)
            self._f.flush()
            self._end = self._f.tell()
            self.lines += 1

    def close(self) -> None:
        with self._lock:
            if self._f.closed:
                return
            try:
                self._f.flush()
            finally:
                if self._f.tell() != self._end:
                    self._f.truncate(self._end)
                self._f.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
