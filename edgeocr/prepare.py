"""Pages prepared for the model, off the thread that decodes: one preparer per loaded model, its strategy fixed
at load with the artifact's own geometry and normalization.

    preparer = open_preparer("fast", art.image, device="cpu")
    prep = preparer("page.jpg")                  # thread-safe host work: decode + letterbox (+ normalize)
    pixels = preparer.pixels(prep)               # what encode_image takes (the device strategy's graph runs here)

Strategies:
- exact  Pillow decodes the whole image and resizes it with its antialiased bicubic (the reference processor)
- fast   a JPEG is decoded at reduced scale where the letterbox allows, OpenCV resizes ([fast] extra)
- device the host only decodes; resize + normalization run on the session's device at admission: on CUDA two
         kernels bit-identical to `exact` (edgeocr.letterbox_cuda), else a small ONNX graph within 2 levels of
         Pillow (edgeocr.preprocess_graph)
docs/perf.md has the measured differences.  Every strategy refuses an image over the pixel limit (from its
header, before decoding) or under the minimum page edge, and marks a page with no ink `blank` (the scheduler
finishes it at admission without running the model).  `PreparePool` runs a preparer on a worker thread ahead
of need.
"""

from __future__ import annotations

import abc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np

from edgeocr import preprocess
from edgeocr.artifact import ImageSpec
from edgeocr.errors import BackendError

STRATEGIES = ("exact", "fast", "device")
LETTERBOX_ENV = "EDGEOCR_LETTERBOX"     # device strategy on CUDA: kernels (default where they build) or graph
log = logging.getLogger("edgeocr")


@dataclass
class Prepared:
    """An image ready for the model.  `blank` may still be computed on a worker thread (Preparer) while the page's
    vision runs: `blank_known()` says whether reading it now waits."""

    pixels: np.ndarray                 # exact/fast: [1, 3, S, S] float32 normalized; device: [H, W, 3] uint8 RGB
    letterbox: preprocess.Letterbox    # where the image sits on the canvas (original size included)
    timings_ms: dict = field(default_factory=dict)   # load (read + decode), preprocess (letterbox + normalize);
                                                     # device path: letterbox (on the GPU, written at admission;
                                                     # each result copies the page's timings when it is built)
    blank_check: bool | Future = False  # no ink (preprocess.is_blank), or its check under way

    @property
    def blank(self) -> bool:
        """No ink: the result is empty, the model is not run (waits for the check; its error, if any, raises)."""
        b = self.blank_check
        return bool(b.result()) if isinstance(b, Future) else bool(b)

    @blank.setter
    def blank(self, value: bool) -> None:
        self.blank_check = bool(value)

    def blank_known(self) -> bool:
        return not isinstance(self.blank_check, Future) or self.blank_check.done()


_blank_pool: ThreadPoolExecutor | None = None
_blank_lock = threading.Lock()


def _check_blank(page) -> Future:
    """preprocess.is_blank(page) on a worker thread (Pillow's histogram leaves the GIL): off the first token's
    path, which it would otherwise lengthen by about 1 ms for a 721 x 1,081 page."""
    global _blank_pool
    with _blank_lock:
        if _blank_pool is None:
            _blank_pool = ThreadPoolExecutor(2, thread_name_prefix="edgeocr-blank")
    return _blank_pool.submit(preprocess.is_blank, page)


def _forget_blank_pool() -> None:          # a forked child has none of the parent's threads
    global _blank_pool, _blank_lock
    _blank_pool, _blank_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_blank_pool)


class Preparer(abc.ABC):
    """Turns an image (path, bytes, preprocess.ImageBytes, numpy array, PIL image; a Prepared passes through)
    into a Prepared.  `__call__` is host work and thread-safe; `pixels` runs where the model runs, at admission.
    Encoded images larger than `max_pixels` are refused from their header (an ImageBytes carries its own limit);
    pages under preprocess.MIN_EDGE raise PageTooSmall."""

    strategy = ""
    letterbox_at_admission = False         # `pixels` letterboxes (the device path): timed apart from the vision

    def __init__(self, spec: ImageSpec, max_pixels: int | None = None):
        self.spec = spec                   # canvas, pad value, mean/std: the artifact's
        if max_pixels is not None:
            preprocess.pixel_limit(max_pixels)       # a bad limit fails at load, not on the first page
        self.max_pixels = max_pixels                 # pixels; None: EDGEOCR_MAX_PIXELS or the default, when used

    def __call__(self, image) -> Prepared:
        if isinstance(image, Prepared):
            return image
        t0 = time.perf_counter()
        img, size = self._load(image)
        t1 = time.perf_counter()
        pixels, lb, page = self._fit(img, size)
        return Prepared(pixels, lb, {"load": (t1 - t0) * 1e3, "preprocess": (time.perf_counter() - t1) * 1e3},
                        blank_check=_check_blank(page))

    def pixels(self, prep: Prepared):
        """What the vision graph takes for `prep`: [1, 3, S, S] float32 (a host array, or an OrtValue)."""
        return prep.pixels

    def _load(self, image):
        img = preprocess.load_image(image, self.max_pixels)
        return img, img.size

    @abc.abstractmethod
    def _fit(self, img, size):
        """-> (pixels, letterbox, the page's pixels [h, w, 3] uint8 for the blank check)."""


class ExactPreparer(Preparer):
    strategy = "exact"

    def _fit(self, img, size):
        s = self.spec
        canvas, lb = preprocess.letterbox(img, s.canvas, s.pad_value)
        return preprocess.normalize(canvas, mean=s.mean, std=s.std), lb, canvas[:lb.new_h, :lb.new_w]


class FastPreparer(Preparer):
    strategy = "fast"

    def _load(self, image):
        return preprocess.load_image_for_canvas(image, self.spec.canvas, self.max_pixels)

    def _fit(self, img, size):
        s = self.spec
        canvas, lb = preprocess.letterbox_fast(img, size, s.canvas, s.pad_value)
        return preprocess.normalize(canvas, mean=s.mean, std=s.std), lb, canvas[:lb.new_h, :lb.new_w]


class DevicePreparer(Preparer):
    """The host decodes; the letterbox and normalization run on the session's device when the page is admitted
    (one device buffer, rewritten for each page).  On CUDA: two CUDA kernels bit-identical to the exact path
    (edgeocr.letterbox_cuda), where NVRTC and the driver can build them; otherwise, and on the CPU, the ONNX
    graph of edgeocr.preprocess_graph (within 2 levels of Pillow).  EDGEOCR_LETTERBOX=graph picks the graph."""

    strategy = "device"
    letterbox_at_admission = True

    def __init__(self, spec: ImageSpec, device: str, max_pixels: int | None = None):
        super().__init__(spec, max_pixels)
        want = os.environ.get(LETTERBOX_ENV, "").strip().lower()
        if want not in ("", "kernels", "graph"):
            raise BackendError(f"{LETTERBOX_ENV}={want!r}: use 'kernels' or 'graph'")
        self.jpeg = preprocess.jpeg_decoder()                              # "simplejpeg" | "pillow", at load
        geometry = dict(canvas=spec.canvas, pad_value=spec.pad_value, mean=spec.mean, std=spec.std)
        self.engine, self.letterbox = "graph", None          # letterbox(rgb, size) -> (pixels OrtValue, Letterbox)
        if device == "cuda" and want != "graph":
            from edgeocr.letterbox_cuda import CudaLetterbox
            try:
                self.engine, self.letterbox = "kernels", CudaLetterbox(**geometry)
            except BackendError as e:
                if want == "kernels":
                    raise
                log.warning("the letterbox kernels could not be built (%s); using the preprocessing graph", e)
        if self.letterbox is None:
            from edgeocr.preprocess_graph import DevicePreprocessor
            self.letterbox = DevicePreprocessor(device=device, **geometry)

    def _load(self, image):
        """An encoded JPEG is decoded into an array by simplejpeg where installed (preprocess.jpeg_decoder: the
        same pixels as Pillow's, without Pillow's copy out); everything else by Pillow."""
        enc = preprocess.encoded(image, self.max_pixels)
        if enc is None:
            return super()._load(image)
        decoded = preprocess.decode_jpeg_array(*enc) if self.jpeg == "simplejpeg" else None
        if decoded is not None:
            return decoded
        img = preprocess.decode_bytes(*enc)
        return img, img.size

    def _fit(self, img, size):
        rgb = img if isinstance(img, np.ndarray) else np.asarray(img)     # [H, W, 3] uint8
        return rgb, preprocess.letterbox_geometry(*size, self.spec.canvas), img    # blank check on the source

    def pixels(self, prep: Prepared):
        out, _ = self.letterbox(prep.pixels, (prep.letterbox.width, prep.letterbox.height))
        return out                                                         # OrtValue [1, 3, S, S] float32


def open_preparer(strategy: str, spec: ImageSpec, device: str = "cpu", max_pixels: int | None = None) -> Preparer:
    """max_pixels: the pixel limit (None: preprocess.pixel_limit(), i.e. EDGEOCR_MAX_PIXELS or the default)."""
    if strategy == "exact":
        return ExactPreparer(spec, max_pixels)
    if strategy == "fast":
        return FastPreparer(spec, max_pixels)
    if strategy == "device":
        return DevicePreparer(spec, device, max_pixels)
    raise BackendError(f"unknown preprocess {strategy!r}; use one of {', '.join(STRATEGIES)}")


class PreparePool:
    """Worker threads that prepare pages ahead of the engine: the host's decoding and letterboxing of the next
    pages overlaps the decode steps of the current ones."""

    def __init__(self, workers: int = 1):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, fn: Callable, *args) -> Future:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="edgeocr-prepare")
        return self._pool.submit(fn, *args)

    def ahead(self, items: Iterable, fn: Callable, depth: int) -> Iterator[tuple[object, Future]]:
        """(item, future of fn(item)) in input order, keeping `depth` submitted ahead of the consumer; `items`
        is pulled lazily on the consumer's thread.  Futures left when the consumer stops are cancelled (one
        already running is waited for: what it uses, e.g. an open PDF, may be closed once this returns)."""
        pending: list[tuple[object, Future]] = []
        it = iter(items)
        exhausted = False
        try:
            while True:
                while not exhausted and len(pending) < max(1, depth):
                    item = next(it, _END)
                    if item is _END:
                        exhausted = True
                        break
                    pending.append((item, self.submit(fn, item)))
                if not pending:
                    return
                yield pending.pop(0)
        finally:
            running = [f for _, f in pending if not f.cancel()]
            if running:
                wait(running)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


_END = object()
