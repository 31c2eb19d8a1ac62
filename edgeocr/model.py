"""OCRModel: image + instruction in, text (and boxes) out, over an edgeocr artifact.

One page (`recognize`, `stream`) or many (`recognize_many`: continuous batching over the artifact's slots);
all three drive edgeocr.batch.SlotScheduler over the session, so a page's tokens do not depend on how it was
asked for."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeocr import artifact as af
from edgeocr import postprocess, preprocess, prompts, rope
from edgeocr.batch import PageRequest, SlotEvent, SlotScheduler
from edgeocr.decode import DecodeOptions, Sequence
from edgeocr.errors import BackendError, PromptError
from edgeocr.postprocess import TextLine
from edgeocr.tokenizer import Tokenizer

log = logging.getLogger("edgeocr")


@dataclass(frozen=True)
class OCRResult:
    text: str                          # decoded output, special tokens removed
    lines: list[TextLine]              # spotting tasks: lines with boxes in original pixels; else []
    finish_reason: str                 # stop | length | cache_full | repetition
    prompt_tokens: int                 # tokens in the prompt, image slots included
    generated_tokens: int              # tokens generated, stop id included
    token_ids: list[int]               # generated ids
    timings_ms: dict[str, float]       # load, preprocess, vision, prefill, decode, total, first_token, per_token
    task: str | None                   # task key, or None for a custom prompt
    image_size: tuple[int, int]        # original (width, height)
    step_ms: tuple[float, ...] = ()    # wall time of each decode step, ms

    def to_dict(self) -> dict:
        return {
            "text": self.text, "finish_reason": self.finish_reason, "task": self.task,
            "lines": [{"text": ln.text, "box": list(ln.box), "box_norm": list(ln.box_norm)} for ln in self.lines],
            "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
            "image_size": list(self.image_size), "timings_ms": {k: round(v, 3) for k, v in self.timings_ms.items()},
        }


@dataclass
class Prepared:
    """An image ready for the model."""

    pixels: object                     # [1, 3, S, S] float32, normalized: numpy, or an OrtValue ("device")
    letterbox: preprocess.Letterbox
    timings_ms: dict = field(default_factory=dict)
    blank: bool = False                # no ink (preprocess.is_blank): the result is empty, the model is not run


def open_session(path: Path, art: af.Artifact, backend: str, device: str, threads: int | None,
                 cuda_graph: bool | None = None):
    if backend == "onnxruntime":
        from edgeocr.backends.ort import open_ort_session
        return open_ort_session(path, art, device=device, threads=threads, cuda_graph=cuda_graph)
    if backend in ("tensorrt", "tensorrt_rtx"):
        if device != "cuda":
            raise BackendError("the TensorRT backend runs on a GPU: use device='cuda'")
        from edgeocr.backends.tensorrt import TrtSession
        return TrtSession(path, art, flavour="auto" if backend == "tensorrt" else backend)
    raise BackendError(f"unknown backend {backend!r}; use 'onnxruntime' or 'tensorrt'")


_END = object()
PREPROCESS = ("exact", "fast", "device")


class Stream:
    """Iterate for (token_id, text_delta) as tokens are generated; `result` is the OCRResult once done."""

    def __init__(self, events: Iterator):
        self._events = events
        self.result: OCRResult | None = None

    def __iter__(self) -> Iterator[tuple[int, str]]:
        for ev in self._events:
            if ev.result is not None:
                self.result = ev.result
            if ev.token_id is not None:            # None: a result without a new token (blank page, cancel)
                yield ev.token_id, ev.text_delta


class OCRModel:
    """Load an artifact once, then `recognize` images.

    >>> model = OCRModel("artifacts/hunyuanocr-fp16", device="cuda")
    >>> result = model.recognize("invoice.png", task="spotting")
    >>> result.text, result.lines[0].box
    >>> for index, r in model.recognize_many(paths, task="structured_parse"):   # N pages at once
    ...     print(paths[index], r.text)

    A model is used by one thread at a time.
    """

    def __init__(self, artifact_dir: str | Path, backend: str = "onnxruntime", device: str = "cpu",
                 threads: int | None = None, rope_layout: str | None = None, cuda_graph: bool | None = None,
                 preprocess: str = "exact"):
        """preprocess: "exact" (Pillow's bicubic, as the reference processor), "fast" (JPEG decoded at reduced
        scale + OpenCV resize on the host; [fast] extra) or "device" (resize + normalize in a small ONNX graph
        on the session's device, within 2 levels of Pillow); measured in docs/perf.md."""
        if preprocess not in PREPROCESS:
            raise BackendError(f"unknown preprocess {preprocess!r}; use one of {', '.join(PREPROCESS)}")
        t0 = time.perf_counter()
        self.path = Path(artifact_dir)
        self.artifact = art = af.read(self.path)
        self.tokenizer = Tokenizer(self.path / art.tokenizer)
        self.session = open_session(self.path, art, backend, device, threads, cuda_graph)
        tk = art.tokens
        self.prompt_tokens = prompts.PromptTokens(bos=tk.bos, system_sep=tk.system_sep, im_start=tk.im_start,
                                                  im_end=tk.im_end, image=tk.image, user=tk.user)
        self.stop_ids = tk.stop_ids
        self.image_spec = art.image
        self.preprocess = preprocess
        self._device_pre = None
        if preprocess == "device":
            from edgeocr.preprocess_graph import DevicePreprocessor
            self._device_pre = DevicePreprocessor(device=device, canvas=art.image.canvas, pad_value=art.image.pad_value)
        r = art.rope
        self.rope_layout = rope_layout or r.layout
        self.freqs = rope.inv_freq(r.head_dim, r.theta, r.alpha)
        self.table_cos, self.table_sin = rope.text_table(art.cache_len, self.freqs)   # [cache_len, D] each
        self.load_ms = (time.perf_counter() - t0) * 1e3
        log.info("loaded %s (%s, %s, %d slot(s)) in %.0f ms", self.path, art.precision, self.session.name,
                 self.slots, self.load_ms)

    @property
    def slots(self) -> int:
        """Pages decoded at once."""
        return self.session.slots

    # ------------------------------------------------------------------ pieces
    def prepare(self, image) -> Prepared:
        """Decode and letterbox an image into the model's input (a Prepared passes through)."""
        if isinstance(image, Prepared):
            return image
        im = self.image_spec
        t0 = time.perf_counter()
        if self.preprocess == "fast":
            img, size = preprocess.load_image_for_canvas(image, im.canvas)
            t1 = time.perf_counter()
            canvas, lb = preprocess.letterbox_fast(img, size, im.canvas, im.pad_value)
            pixels = preprocess.normalize(canvas, mean=im.mean, std=im.std)
            page = canvas[:lb.new_h, :lb.new_w]                 # the image on the canvas, without the padding
        elif self.preprocess == "device":
            img = preprocess.load_image(image)
            t1 = time.perf_counter()
            pixels, lb = self._device_pre(np.asarray(img))      # OrtValue [1, 3, S, S] on the device
            page = np.asarray(img)                              # the blank check reads the source pixels
        else:
            img = preprocess.load_image(image)
            t1 = time.perf_counter()
            canvas, lb = preprocess.letterbox(img, im.canvas, im.pad_value)
            pixels = preprocess.normalize(canvas, mean=im.mean, std=im.std)
            page = canvas[:lb.new_h, :lb.new_w]
        t2 = time.perf_counter()
        return Prepared(pixels, lb, {"load": (t1 - t0) * 1e3, "preprocess": (t2 - t1) * 1e3},
                        blank=preprocess.is_blank(page))

    def instruction(self, task: str | None, prompt: str | None, lang: str = "zh") -> tuple[str, str | None]:
        if prompt is not None:
            if not isinstance(prompt, str) or not prompt.strip():
                raise PromptError("custom prompt must be a non-empty string")
            return prompt, None
        task = task or prompts.DEFAULT_TASK
        return prompts.task_prompt(task, lang), task

    def prompt_ids(self, instruction: str) -> np.ndarray:
        ids = prompts.build_prompt_ids(self.prompt_tokens, self.image_spec.n_image_tokens,
                                       self.tokenizer.encode(instruction))
        limit = min(self.artifact.decoder.prefill_len, self.artifact.cache_len - 1)
        if len(ids) > limit:
            raise PromptError(f"prompt is {len(ids)} tokens ({len(ids) - self.image_spec.n_image_tokens} of text), "
                              f"longer than the {limit} this artifact's KV cache/prefill allows")
        return np.asarray(ids, np.int64)

    def rope_tables(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        start = int(np.flatnonzero(ids == self.prompt_tokens.image)[0])
        grid = (self.image_spec.grid, self.image_spec.grid)
        pos = rope.position_ids(len(ids), start, grid, self.image_spec.merge_size)
        return rope.cos_sin(pos, self.freqs, self.artifact.rope.sections, self.rope_layout)

    # ------------------------------------------------------------------ API
    def _events(self, request: PageRequest, stop_check: Callable[[], bool] | None, deltas: bool):
        sched = SlotScheduler(self, deltas=deltas)
        tag = object()
        sched.admit(request, tag)
        while True:
            for ev in sched.step():
                yield ev
                if ev.result is not None:
                    return
            if stop_check is not None and stop_check():
                yield SlotEvent(tag, None, "", sched.cancel(tag))     # the result alone, no new token
                return

    def stream(self, image, task: str | None = None, prompt: str | None = None, lang: str = "zh",
               options: DecodeOptions = DecodeOptions(),
               stop_check: Callable[[], bool] | None = None) -> Stream:
        """Iterate the returned Stream for (token_id, text_delta) as tokens are generated; its `result` is the
        OCRResult once the iteration ends.  stop_check() returning True ends generation early (finish_reason
        'cancelled')."""
        return Stream(self._events(PageRequest(image, task, prompt, lang, options), stop_check, deltas=True))

    def recognize(self, image, task: str | None = None, prompt: str | None = None, lang: str = "zh",
                  options: DecodeOptions = DecodeOptions(),
                  on_token: Callable[[int, str], None] | None = None,
                  stop_check: Callable[[], bool] | None = None) -> OCRResult:
        """Run one image.  task: an official task key (see edgeocr.prompts.task_names()); prompt: a
        custom instruction instead; on_token(id, text_delta) is called as tokens arrive; stop_check()
        returning True ends generation early (finish_reason 'cancelled')."""
        request = PageRequest(image, task, prompt, lang, options)
        result = None
        for ev in self._events(request, stop_check, deltas=on_token is not None):
            if on_token is not None and ev.token_id is not None:
                on_token(ev.token_id, ev.text_delta)
            result = ev.result or result
        return result

    def prefetch(self, images: Iterable, depth: int) -> Iterator[Prepared]:
        """`prepare` the images on a worker thread, `depth` ahead of the consumer: the host's decoding and
        letterboxing of the next pages overlaps the decode steps of the current ones.  An image that fails
        raises its error when its turn comes."""
        from concurrent.futures import ThreadPoolExecutor

        if self._device_pre is not None:        # one device buffer for the pixels: prepared just in time
            for img in images:
                yield self.prepare(img)
            return
        with ThreadPoolExecutor(1, thread_name_prefix="edgeocr-prepare") as pool:
            ahead = []
            it = iter(images)
            try:
                while True:
                    while len(ahead) < depth:
                        img = next(it, _END)
                        if img is _END:
                            break
                        ahead.append(pool.submit(self.prepare, img))
                    if not ahead:
                        return
                    yield ahead.pop(0).result()
            finally:
                for f in ahead:
                    f.cancel()

    def recognize_many(self, images: Iterable, task: str | None = None, prompt: str | None = None,
                       lang: str = "zh", options: DecodeOptions = DecodeOptions()) -> Iterator[tuple[int, OCRResult]]:
        """Run many images, `slots` at a time, yielding (index, OCRResult) as pages finish (not necessarily in
        input order).  `images` is consumed lazily and prepared (decoded, letterboxed) on a worker thread ahead
        of need; a freed slot takes the next image at once.  A bad image raises its EdgeOCRError (ImageError,
        ...) with the pages already yielded kept."""
        sched = SlotScheduler(self)
        source = enumerate(self.prefetch(images, depth=self.slots))
        exhausted = False
        while True:
            while not exhausted and sched.free():
                item = next(source, None)
                if item is None:
                    exhausted = True
                    break
                sched.admit(PageRequest(item[1], task, prompt, lang, options), item[0])
            if sched.idle():
                return
            for ev in sched.step():
                if ev.result is not None:
                    yield ev.tag, ev.result

    def result(self, seq: Sequence, prep: Prepared, task_key, vision_ms: float, t_start: float) -> OCRResult:
        """A finished sequence as an OCRResult (text cleaned, spotting boxes mapped back to the image)."""
        text = postprocess.clean_repeated_substrings(self.tokenizer.decode(seq.tokens))
        lines = []
        if task_key in prompts.SPOTTING_TASKS:
            lines = postprocess.parse_spotting(text, prep.letterbox, self.image_spec.canvas)
        n = len(seq.tokens)
        timings = dict(prep.timings_ms)
        timings.update({"vision": vision_ms, "prefill": seq.prefill_ms, "decode": seq.decode_ms,
                        "first_token": vision_ms + seq.prefill_ms + seq.first_token_ms,
                        "per_token": seq.decode_ms / (n - 1) if n > 1 else 0.0,
                        "total": (time.perf_counter() - t_start) * 1e3})
        return OCRResult(text=text, lines=lines, finish_reason=seq.finish_reason, prompt_tokens=len(seq.prompt_ids),
                         generated_tokens=n, token_ids=list(seq.tokens), timings_ms=timings, task=task_key,
                         image_size=(prep.letterbox.width, prep.letterbox.height), step_ms=tuple(seq.step_ms))
