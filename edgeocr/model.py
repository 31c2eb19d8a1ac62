"""OCRModel: image + instruction in, text (and boxes) out, over an edgeocr artifact."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeocr import postprocess, preprocess, prompts, rope
from edgeocr.decode import DecodeOptions, DecodeState, greedy
from edgeocr.errors import BackendError, PromptError
from edgeocr.manifest import Manifest, read_manifest
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

    pixels: np.ndarray                 # [1, 3, S, S] float32
    letterbox: preprocess.Letterbox
    timings_ms: dict = field(default_factory=dict)


def open_session(artifact: Path, m: Manifest, backend: str, device: str, threads: int | None,
                 cuda_graph: bool | None = None):
    if backend == "onnxruntime":
        from edgeocr.backends.ort import OrtSession
        return OrtSession(artifact, m, device=device, threads=threads, cuda_graph=cuda_graph)
    if backend in ("tensorrt", "tensorrt_rtx"):
        if device != "cuda":
            raise BackendError("the TensorRT backend runs on a GPU: use device='cuda'")
        from edgeocr.backends.trt import TrtSession
        return TrtSession(artifact, m, flavour="auto" if backend == "tensorrt" else backend)
    raise BackendError(f"unknown backend {backend!r}; use 'onnxruntime' or 'tensorrt'")


class OCRModel:
    """Load an artifact once, then `recognize` images.

    >>> model = OCRModel("artifacts/hunyuanocr-fp16", device="cuda")
    >>> result = model.recognize("invoice.png", task="spotting")
    >>> result.text, result.lines[0].box
    """

    def __init__(self, artifact_dir: str | Path, backend: str = "onnxruntime", device: str = "cpu",
                 threads: int | None = None, rope_layout: str | None = None, cuda_graph: bool | None = None):
        t0 = time.perf_counter()
        self.path = Path(artifact_dir)
        self.manifest = m = read_manifest(self.path)
        self.tokenizer = Tokenizer(self.path / m.tokenizer)
        self.session = open_session(self.path, m, backend, device, threads, cuda_graph)
        tk = m.tokens
        self.prompt_tokens = prompts.PromptTokens(bos=tk["bos"], system_sep=tk["system_sep"], im_start=tk["im_start"],
                                                  im_end=tk["im_end"], image=tk["image"], user=tk["user"])
        self.stop_ids = tuple(tk["stop_ids"])
        pp = m.preprocess
        self.canvas, self.pad_value = pp["canvas"], pp["pad_value"]
        self.n_image_tokens = pp["n_image_tokens"]
        self.grid = (self.canvas // pp["patch_size"], self.canvas // pp["patch_size"])
        self.merge = pp["merge_size"]
        r = m.rope
        self.rope_layout = rope_layout or r["layout"]
        self.sections = tuple(r["sections"])
        self.freqs = rope.inv_freq(r["head_dim"], r["theta"], r["alpha"])
        self.table_cos, self.table_sin = rope.text_table(self.session.max_len, self.freqs)   # [MAX, D]
        self.max_prefill = m.graphs["decoder"].get("max_prefill_len", self.session.max_len)
        self.load_ms = (time.perf_counter() - t0) * 1e3
        log.info("loaded %s (%s, %s) in %.0f ms", self.path, m.precision, self.session.name, self.load_ms)

    # ------------------------------------------------------------------ pieces
    def prepare(self, image) -> Prepared:
        t0 = time.perf_counter()
        img = preprocess.load_image(image)
        t1 = time.perf_counter()
        canvas, lb = preprocess.letterbox(img, self.canvas, self.pad_value)
        pixels = preprocess.normalize(canvas)
        t2 = time.perf_counter()
        return Prepared(pixels, lb, {"load": (t1 - t0) * 1e3, "preprocess": (t2 - t1) * 1e3})

    def instruction(self, task: str | None, prompt: str | None, lang: str = "zh") -> tuple[str, str | None]:
        if prompt is not None:
            if not isinstance(prompt, str) or not prompt.strip():
                raise PromptError("custom prompt must be a non-empty string")
            return prompt, None
        task = task or prompts.DEFAULT_TASK
        return prompts.task_prompt(task, lang), task

    def prompt_ids(self, instruction: str) -> np.ndarray:
        ids = prompts.build_prompt_ids(self.prompt_tokens, self.n_image_tokens, self.tokenizer.encode(instruction))
        limit = min(self.max_prefill, self.session.max_len - 1)
        if len(ids) > limit:
            raise PromptError(f"prompt is {len(ids)} tokens ({len(ids) - self.n_image_tokens} of text), "
                              f"longer than the {limit} this artifact's KV cache/prefill allows")
        return np.asarray(ids, np.int64)

    def rope_tables(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        start = int(np.flatnonzero(ids == self.prompt_tokens.image)[0])
        pos = rope.position_ids(len(ids), start, self.grid, self.merge)
        return rope.cos_sin(pos, self.freqs, self.sections, self.rope_layout)

    # ------------------------------------------------------------------ API
    def _generate(self, image, task, prompt, lang, options: DecodeOptions,
                  stop_check: Callable[[], bool] | None) -> Iterator[tuple[int, DecodeState]]:
        """Prepare, encode the image, then yield (token, state) per generated token; the finished
        OCRResult is left in `self.last_result`."""
        t_start = time.perf_counter()
        instruction, task_key = self.instruction(task, prompt, lang)
        options.validate(self.session.max_len)
        prep = self.prepare(image)
        ids = self.prompt_ids(instruction)
        cos, sin = self.rope_tables(ids)
        t0 = time.perf_counter()
        self.session.encode_image(prep.pixels, fetch=False)
        vision_ms = (time.perf_counter() - t0) * 1e3
        penalty = options.repetition_penalty or self.manifest.decode.get("repetition_penalty", 1.08)
        st = DecodeState()
        for tok in greedy(self.session, ids, cos, sin, self.table_cos, self.table_sin, self.stop_ids, penalty,
                          options, text_of=self.tokenizer.decode, state=st, stop_check=stop_check):
            yield tok, st
        self.last_result = self._result(st, ids, prep, task_key, vision_ms, t_start)

    def stream(self, image, task: str | None = None, prompt: str | None = None, lang: str = "zh",
               options: DecodeOptions = DecodeOptions(),
               stop_check: Callable[[], bool] | None = None) -> Iterator[tuple[int, str]]:
        """Yield (token_id, text_delta) as tokens are generated.  The final OCRResult is
        available as `self.last_result` when the iterator is exhausted."""
        text_so_far = ""
        for tok, st in self._generate(image, task, prompt, lang, options, stop_check):
            text = self.tokenizer.decode(st.tokens)
            if text.endswith("\ufffd") and not st.finish_reason:   # incomplete UTF-8: hold back
                yield tok, ""
                continue
            delta, text_so_far = text[len(text_so_far):], text
            yield tok, delta

    def recognize(self, image, task: str | None = None, prompt: str | None = None, lang: str = "zh",
                  options: DecodeOptions = DecodeOptions(),
                  on_token: Callable[[int, str], None] | None = None,
                  stop_check: Callable[[], bool] | None = None) -> OCRResult:
        """Run one image.  task: an official task key (see edgeocr.prompts.task_names()); prompt: a
        custom instruction instead; on_token(id, text_delta) is called as tokens arrive; stop_check()
        returning True ends generation early (finish_reason 'cancelled')."""
        if on_token is not None:
            for tok, delta in self.stream(image, task, prompt, lang, options, stop_check):
                on_token(tok, delta)
        else:
            for _ in self._generate(image, task, prompt, lang, options, stop_check):
                pass
        return self.last_result

    def _result(self, st: DecodeState, ids, prep: Prepared, task_key, vision_ms, t_start) -> OCRResult:
        text = postprocess.clean_repeated_substrings(self.tokenizer.decode(st.tokens))
        lines = []
        if task_key in prompts.SPOTTING_TASKS:
            lines = postprocess.parse_spotting(text, prep.letterbox, self.canvas)
        n = len(st.tokens)
        timings = dict(prep.timings_ms)
        timings.update({"vision": vision_ms, "prefill": st.prefill_ms, "decode": st.decode_ms,
                        "first_token": vision_ms + st.prefill_ms + st.first_token_ms,
                        "per_token": st.decode_ms / max(n - 1, 1) if n > 1 else 0.0,
                        "total": (time.perf_counter() - t_start) * 1e3})
        return OCRResult(text=text, lines=lines, finish_reason=st.finish_reason, prompt_tokens=len(ids),
                         generated_tokens=n, token_ids=list(st.tokens), timings_ms=timings, task=task_key,
                         image_size=(prep.letterbox.width, prep.letterbox.height), step_ms=tuple(st.step_ms))
