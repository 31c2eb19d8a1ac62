"""What a finished page becomes: `OCRResult`, built by `ResultBuilder` from its sequence and prepared image."""

from __future__ import annotations

import time
from dataclasses import dataclass

from edgeocr import postprocess, prompts
from edgeocr.decode import FinishReason, Sequence
from edgeocr.postprocess import TextLine
from edgeocr.prepare import Prepared


@dataclass(frozen=True)
class OCRResult:
    text: str                          # decoded output, special tokens removed
    lines: list[TextLine]              # spotting tasks: lines with boxes in original pixels; else []
    finish_reason: FinishReason        # stop | length | cache_full | repetition | cancelled (a str)
    prompt_tokens: int                 # tokens in the prompt, image slots included
    generated_tokens: int              # tokens generated, stop id included
    token_ids: list[int]               # generated ids
    timings_ms: dict[str, float]       # load, preprocess, vision, prefill, decode, total, first_token, per_token;
                                       # letterbox on the device path (at admission: inside first_token)
    task: str | None                   # task key, or None for a custom prompt
    image_size: tuple[int, int]        # original (width, height)
    step_ms: tuple[float, ...] = ()    # wall time of each decode step, ms

    def to_dict(self) -> dict:
        return {
            "text": self.text, "finish_reason": str(self.finish_reason), "task": self.task,
            "lines": [{"text": ln.text, "box": list(ln.box), "box_norm": list(ln.box_norm)} for ln in self.lines],
            "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
            "image_size": list(self.image_size), "timings_ms": {k: round(v, 3) for k, v in self.timings_ms.items()},
        }


CUT = frozenset({FinishReason.LENGTH, FinishReason.CACHE_FULL, FinishReason.REPETITION, FinishReason.CANCELLED})


def drop_cut_character(text: str, tokens: list[int], tokenizer, finish_reason) -> str:
    """`text` (the decoded `tokens`, or its end) without the replacement character that a page cut off inside a
    character ends on: byte-level BPE writes a character in one to four tokens.  Only for a page that was cut
    (not one the model stopped) and only where the tokens' bytes end inside a character, so a U+FFFD the model
    wrote whole is kept."""
    if finish_reason in CUT and text.endswith("\ufffd") and tokenizer.ends_inside_a_character(tokens):
        return text[:-1]
    return text


class ResultBuilder:
    """A finished sequence as an OCRResult: text cleaned, spotting boxes mapped back to the original image."""

    def __init__(self, tokenizer, canvas: int):
        self.tokenizer = tokenizer          # edgeocr.tokenizer.Tokenizer
        self.canvas = canvas                # model input edge, pixels (the boxes' frame)

    def __call__(self, seq: Sequence, prep: Prepared, task: str | None, vision_ms: float,
                 admitted: float) -> OCRResult:
        """admitted: perf_counter when the page's admission began; `total` adds its preparation time."""
        text = drop_cut_character(self.tokenizer.decode(seq.tokens), seq.tokens, self.tokenizer, seq.finish_reason)
        text = postprocess.clean_repeated_substrings(text)
        lines = []
        if task in prompts.SPOTTING_TASKS:
            lines = postprocess.parse_spotting(text, prep.letterbox, self.canvas)
        n = len(seq.tokens)
        timings = dict(prep.timings_ms)
        prepared_ms = sum(prep.timings_ms.get(k, 0.0) for k in ("load", "preprocess"))
        timings.update({"vision": vision_ms, "prefill": seq.prefill_ms, "decode": seq.decode_ms,
                        "first_token": seq.first_token_ms,
                        "per_token": seq.decode_ms / (n - 1) if n > 1 else 0.0,
                        "total": prepared_ms + (time.perf_counter() - admitted) * 1e3})
        return OCRResult(text=text, lines=lines, finish_reason=seq.finish_reason,
                         prompt_tokens=len(seq.prompt_ids), generated_tokens=n, token_ids=list(seq.tokens),
                         timings_ms=timings, task=task,
                         image_size=(prep.letterbox.width, prep.letterbox.height), step_ms=tuple(seq.step_ms))
