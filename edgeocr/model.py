"""OCRModel: image + instruction in, text (and boxes) out, over an edgeocr artifact.

The loaded model holds what does not change while pages decode: the session (graphs + static KV cache), the
tokenizer, the preparer and its worker pool, the prompt layout and the RoPE tables.  It makes prepared pages
(`page`) and schedulers (`scheduler`); each page's generation state lives in edgeocr.slots.SlotScheduler.
One page (`recognize`, `stream`) or many (`recognize_many`: continuous batching over the artifact's slots)
all run through edgeocr.slots.drive, so a page's tokens do not depend on how it was asked for."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from edgeocr import artifact as af
from edgeocr import prompts, rope
from edgeocr.decode import DecodeOptions
from edgeocr.errors import BackendError, PromptError
from edgeocr.prepare import STRATEGIES, Prepared, PreparePool, open_preparer
from edgeocr.result import OCRResult, ResultBuilder
from edgeocr.slots import Page, Prompt, SlotEvent, SlotScheduler, drive
from edgeocr.tokenizer import Tokenizer

log = logging.getLogger("edgeocr")

__all__ = ["OCRModel", "OCRResult", "Prepared", "Stream", "open_session"]


def open_session(path: Path, art: af.Artifact, backend: str, device: str, threads: int | None,
                 cuda_graph: bool | None = None, vision_ahead: bool | None = None):
    if backend == "onnxruntime":
        from edgeocr.backends.ort import open_ort_session
        return open_ort_session(path, art, device=device, threads=threads, cuda_graph=cuda_graph,
                                vision_ahead=vision_ahead)
    if backend in ("tensorrt", "tensorrt_rtx"):
        from edgeocr.backends.tensorrt import EXPERIMENTAL, TrtSession
        log.warning(EXPERIMENTAL)
        if device != "cuda":
            raise BackendError("the TensorRT backend runs on a GPU: use device='cuda'")
        return TrtSession(path, art, flavour="auto" if backend == "tensorrt" else backend)
    raise BackendError(f"unknown backend {backend!r}; use 'onnxruntime' or 'tensorrt'")


class Stream:
    """Iterate for (token_id, text_delta) as tokens are generated; `result` is the OCRResult once done."""

    def __init__(self, events: Iterator[SlotEvent]):
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
                 preprocess: str | None = None, max_pixels: int | None = None, vision_ahead: bool | None = None):
        """preprocess: "exact" (Pillow's bicubic on the host, as the reference processor), "fast" (JPEG decoded
        at reduced scale + OpenCV resize on the host; [fast] extra) or "device" (the host decodes; resize and
        normalization run on the session's device: on CUDA two kernels bit-identical to "exact", elsewhere a
        small ONNX graph within 2 levels of Pillow, as on CUDA where NVRTC cannot build the kernels, with a
        warning); measured in docs/perf.md.  None: "device" with ONNX Runtime on CUDA, "exact" elsewhere
        (edgeocr.bench.default_preprocess).
        max_pixels: images larger than this are refused from their header (None: EDGEOCR_MAX_PIXELS, else
        edgeocr.preprocess.DEFAULT_MAX_PIXELS).
        vision_ahead: the default of this model's schedulers (None: EDGEOCR_VISION_AHEAD, else off): each page's
        vision on its own thread while the other slots decode (edgeocr.slots); on, the vision graph is not
        replayed as a CUDA graph by default (edgeocr.ort_options.vision_graph_default)."""
        if preprocess is None:
            from edgeocr.bench import default_preprocess
            preprocess = default_preprocess(device, backend)
        if preprocess not in STRATEGIES:
            raise BackendError(f"unknown preprocess {preprocess!r}; use one of {', '.join(STRATEGIES)}")
        t0 = time.perf_counter()
        self.path = Path(artifact_dir)
        self.vision_ahead = vision_ahead
        self.artifact = art = af.read(self.path)
        self.tokenizer = Tokenizer(self.path / art.tokenizer)
        self.session = open_session(self.path, art, backend, device, threads, cuda_graph, vision_ahead)
        tk = art.tokens
        self.prompt_tokens = prompts.PromptTokens(bos=tk.bos, system_sep=tk.system_sep, im_start=tk.im_start,
                                                  im_end=tk.im_end, image=tk.image, user=tk.user)
        self.stop_ids = tk.stop_ids
        self.image_spec = art.image
        self.preprocess = preprocess
        self.preparer = open_preparer(preprocess, art.image, device, max_pixels)   # the artifact's geometry, mean/std
        self.workers = PreparePool(1)                                  # runs the preparer ahead of need
        self.results = ResultBuilder(self.tokenizer, art.image.canvas)
        r = art.rope
        self.rope_layout = rope_layout or r.layout
        self.freqs = rope.inv_freq(r.head_dim, r.theta, r.alpha)
        self.table_cos, self.table_sin = rope.text_table(art.cache_len, self.freqs)   # [cache_len, D] each
        self._prompt = functools.lru_cache(maxsize=64)(self._build_prompt)
        self.load_ms = (time.perf_counter() - t0) * 1e3
        log.info("loaded %s (%s, %s, %d slot(s)) in %.0f ms", self.path, art.precision, self.session.name,
                 self.slots, self.load_ms)

    @property
    def slots(self) -> int:
        """Pages decoded at once."""
        return self.session.slots

    # ------------------------------------------------------------------ pieces (no sequence state)
    def prepare(self, image) -> Prepared:
        """Decode and letterbox an image into the model's input (a Prepared passes through)."""
        return self.preparer(image)

    def instruction(self, task: str | None, prompt: str | None, lang: str = "zh") -> tuple[str, str | None]:
        if prompt is not None:
            if task is not None:
                raise PromptError(f"give either a task or a custom prompt, not both (task {task!r})")
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

    def _build_prompt(self, instruction: str) -> Prompt:
        ids = self.prompt_ids(instruction)
        cos, sin = self.rope_tables(ids)
        for a in (ids, cos, sin):
            a.flags.writeable = False          # shared by every page with this instruction
        return Prompt(ids, cos, sin)

    def page(self, image, task: str | None = None, prompt: str | None = None, lang: str = "zh",
             options: DecodeOptions = DecodeOptions()) -> Page:
        """A page ready for SlotScheduler.admit: options checked, the image prepared (decoded and letterboxed
        here, on the calling thread: run it on a worker), the prompt tokenized.  Raises EdgeOCRError
        subclasses (ImageError, PromptError, ...) on bad input."""
        options.validate()
        instruction, task_key = self.instruction(task, prompt, lang)
        built = self._prompt(instruction)
        prep = self.preparer(image)
        return Page(prep, built, task_key, options,
                    stop_ids=frozenset() if options.ignore_stop else frozenset(self.stop_ids),
                    penalty=options.repetition_penalty or self.artifact.repetition_penalty)

    def pages(self, images: Iterable, task: str | None = None, prompt: str | None = None, lang: str = "zh",
              options: DecodeOptions = DecodeOptions()) -> Iterator[tuple[int, Page]]:
        """(index, Page) for each image, pulled lazily and prepared on the worker pool `slots` ahead of the
        consumer; a page that fails raises its error when its turn comes."""
        make = functools.partial(self.page, task=task, prompt=prompt, lang=lang, options=options)
        for i, (_, fut) in enumerate(self.workers.ahead(images, make, depth=self.slots)):
            yield i, fut.result()

    def scheduler(self, deltas: bool = False, vision_ahead: bool | None = None,
                  prefill_beside: bool | None = None) -> SlotScheduler:
        """A scheduler over this model's session and pieces (one in use at a time: they share the KV cache).
        vision_ahead: a page's vision runs on a worker thread while the other slots decode (None: the model's
        own setting, else the EDGEOCR_VISION_AHEAD environment variable, off when unset; edgeocr.slots).
        prefill_beside: with vision ahead, its prefill too, on a second decoder session (None: the
        EDGEOCR_PREFILL_BESIDE environment variable where the artifact allows it, else off)."""
        if vision_ahead is None:
            vision_ahead = self.vision_ahead
        return SlotScheduler(self.session, self.preparer, self.tokenizer, self.results,
                             (self.table_cos, self.table_sin), deltas=deltas, vision_ahead=vision_ahead,
                             prefill_beside=prefill_beside)

    # ------------------------------------------------------------------ API
    def _one(self, page_args: tuple, stop_check: Callable[[], bool] | None, deltas: bool) -> Iterator[SlotEvent]:
        page = self.workers.submit(self.page, *page_args).result()
        sched, tag = self.scheduler(deltas=deltas, vision_ahead=False), object()     # one page: nothing to overlap
        for events in drive(sched, [(tag, page)]):
            yield from events
            if any(ev.result is not None for ev in events):
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
        return Stream(self._one((image, task, prompt, lang, options), stop_check, deltas=True))

    def recognize(self, image, task: str | None = None, prompt: str | None = None, lang: str = "zh",
                  options: DecodeOptions = DecodeOptions(),
                  on_token: Callable[[int, str], None] | None = None,
                  stop_check: Callable[[], bool] | None = None) -> OCRResult:
        """Run one image.  task: an official task key (see edgeocr.prompts.task_names()); prompt: a
        custom instruction instead; on_token(id, text_delta) is called as tokens arrive; stop_check()
        returning True ends generation early (finish_reason 'cancelled')."""
        result = None
        for ev in self._one((image, task, prompt, lang, options), stop_check, deltas=on_token is not None):
            if on_token is not None and ev.token_id is not None:
                on_token(ev.token_id, ev.text_delta)
            result = ev.result or result
        return result

    def recognize_many(self, images: Iterable, task: str | None = None, prompt: str | None = None,
                       lang: str = "zh", options: DecodeOptions = DecodeOptions()) -> Iterator[tuple[int, OCRResult]]:
        """Run many images, `slots` at a time, yielding (index, OCRResult) as pages finish (not necessarily in
        input order).  `images` is consumed lazily and prepared (decoded, letterboxed) on a worker thread ahead
        of need; a freed slot takes the next image at once.  A bad image raises its EdgeOCRError (ImageError,
        ...) with the pages already yielded kept."""
        for events in drive(self.scheduler(), self.pages(images, task, prompt, lang, options)):
            for ev in events:
                if ev.result is not None:
                    yield ev.tag, ev.result
