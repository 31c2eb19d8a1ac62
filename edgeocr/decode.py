"""A page's decoding: HunyuanOCR's decoding contract (spec §7.4) and the per-page state it needs.

The contract: greedy argmax after an HF-style repetition penalty over every unique id in prompt + output
(image slots included), stop on the checkpoint's stop ids, stop on tail repetition, cap at max_new_tokens.

What each step of a page's decoding needs besides the graph run (edgeocr.slots runs the loop, through the
session's token selection strategy, edgeocr.selection):
  DecodeOptions  a request's decoding options, validated
  Sequence       one page's decoding state while it holds a slot
  finish_reason  whether a sequence ends with the token it just produced
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from edgeocr.errors import PromptError


class FinishReason(str, Enum):
    """Why a page's generation ended.  A str: compares equal to, and serializes as, its value."""

    STOP = "stop"                   # a stop id was produced
    LENGTH = "length"               # max_new_tokens reached
    CACHE_FULL = "cache_full"       # the static KV cache is full
    REPETITION = "repetition"       # the output tail repeats (spec §7.3)
    CANCELLED = "cancelled"         # the caller stopped it (stop_check, client gone, deadline, shutdown)
    BLANK = "blank"                 # the page has no ink: nothing was generated (no prefill, no decode step)

    def __str__(self) -> str:
        return self.value

    __hash__ = str.__hash__            # equal to its value, so hashed like it (sets, dict keys)


@dataclass(frozen=True)
class DecodeOptions:
    max_new_tokens: int = 1024                 # cap on generated tokens
    repetition_penalty: float | None = None    # None: the artifact's default (its checkpoint's)
    ignore_stop: bool = False                  # keep going past stop ids (fixed-length benchmarks)
    tail_repetition_stop: bool = True          # stop when the text tail repeats (spec §7.3)
    tail_min_chars: int = 4000                 # start checking once the text is this long, chars
    tail_check_every: int = 1000               # check again every this many new chars
    tail_window: int = 8000                    # look at this many trailing chars
    tail_min_repeats: int = 8                  # a unit repeated this often back to back is a loop

    def validate(self) -> None:
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) \
                or self.max_new_tokens < 1:
            raise PromptError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if self.repetition_penalty is not None and not (self.repetition_penalty > 0):
            raise PromptError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")


@dataclass
class Sequence:
    """One page's decoding state while it holds a slot."""

    prompt_ids: np.ndarray                               # [S] int64, image slots included
    options: DecodeOptions
    stop_ids: frozenset[int]                             # empty with options.ignore_stop
    penalty: float                                       # repetition penalty in force
    tokens: list[int] = field(default_factory=list)      # generated ids, stop id included
    finish_reason: FinishReason | None = None            # None while it goes on
    next_check: int = 0                                  # text length of the next tail-repetition check
    prefill_ms: float = 0.0                              # prefill and first token chosen
    first_token_ms: float = 0.0                          # admission -> first token (vision, waits, prefill)
    decode_ms: float = 0.0                               # first token -> last token
    step_ms: list[float] = field(default_factory=list)   # wall time of each decode step it took part in

    @property
    def next_pos(self) -> int:
        """Cache row the next step writes (the last token's)."""
        return len(self.prompt_ids) + len(self.tokens) - 1


def tail_repeats(text: str, window: int, min_repeats: int, max_unit: int = 256) -> bool:
    """True when the last `window` chars end in a unit (1..max_unit chars, not all whitespace)
    repeated at least `min_repeats` times back to back."""
    tail = text[-window:]
    n = len(tail)
    for u in range(1, min(max_unit, n // min_repeats) + 1):
        unit = tail[n - u:]
        if unit.isspace():
            continue
        if tail.endswith(unit * min_repeats):
            return True
    return False


def finish_reason(seq: Sequence, tok: int, cache_len: int,
                  text_of: Callable[[list[int]], str] | None) -> FinishReason | None:
    """Why `seq` ends with `tok` (already appended to seq.tokens), or None to go on."""
    n = len(seq.tokens)
    if tok in seq.stop_ids:
        return FinishReason.STOP
    if n == seq.options.max_new_tokens:
        return FinishReason.LENGTH
    if seq.next_pos >= cache_len:                 # no row left for this token
        return FinishReason.CACHE_FULL
    if seq.options.tail_repetition_stop and text_of is not None and n * 4 >= seq.next_check:
        text = text_of(seq.tokens)
        if len(text) >= seq.next_check:
            seq.next_check = len(text) + seq.options.tail_check_every
            if tail_repeats(text, seq.options.tail_window, seq.options.tail_min_repeats):
                return FinishReason.REPETITION
    return None
