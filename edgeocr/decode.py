"""Greedy decoding over a Session with HunyuanOCR's decoding contract (spec §7.4).

prefill -> decode_one_token -> decode_n_tokens, as small named functions.  The contract:
greedy argmax after an HF-style repetition penalty over every unique id in prompt + output (image
slots included), stop on the checkpoint's stop ids, stop on tail repetition, cap at max_new_tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from edgeocr.backends.base import Session

FINISH_STOP = "stop"                # a stop id was produced
FINISH_LENGTH = "length"            # max_new_tokens reached
FINISH_CACHE = "cache_full"         # the static KV cache is full
FINISH_REPETITION = "repetition"    # the output tail repeats (spec §7.3)
FINISH_CANCELLED = "cancelled"      # the caller's stop_check said stop (deadline, shutdown)


@dataclass(frozen=True)
class DecodeOptions:
    max_new_tokens: int = 1024                 # cap on generated tokens
    repetition_penalty: float | None = None    # None: the artifact's default (1.08 for 1.5)
    ignore_stop: bool = False                  # keep going past stop ids (fixed-length benchmarks)
    tail_repetition_stop: bool = True          # stop when the text tail repeats (spec §7.3)
    tail_min_chars: int = 4000                 # start checking once the text is this long, chars
    tail_check_every: int = 1000               # check again every this many new chars
    tail_window: int = 8000                    # look at this many trailing chars
    tail_min_repeats: int = 8                  # a unit repeated this often back to back is a loop

    def validate(self, cache_len: int) -> None:
        from edgeocr.errors import PromptError
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise PromptError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if self.repetition_penalty is not None and not (self.repetition_penalty > 0):
            raise PromptError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")


@dataclass
class DecodeState:
    tokens: list[int] = field(default_factory=list)     # generated ids, stop id included
    finish_reason: str = ""
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    first_token_ms: float = 0.0                          # prefill end -> first token chosen
    step_ms: list[float] = field(default_factory=list)   # wall time of each decode step (session.step)


class RepetitionPenalty:
    """HF semantics: for each unique id seen, logit / p if logit > 0 else logit * p."""

    def __init__(self, vocab: int, penalty: float, prompt_ids: np.ndarray):
        self.p = np.float32(penalty)
        self.seen = np.zeros(vocab, dtype=bool)
        self.seen[np.asarray(prompt_ids, np.int64)] = True
        self.ids = np.flatnonzero(self.seen)

    def add(self, token: int) -> None:
        if not self.seen[token]:
            self.seen[token] = True
            self.ids = np.append(self.ids, token)

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        if self.p == 1.0:
            return logits
        sel = logits[self.ids]
        logits[self.ids] = np.where(sel < 0, sel * self.p, sel / self.p)
        return logits


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


def greedy(session: Session, prompt_ids: np.ndarray, cos: np.ndarray, sin: np.ndarray,
           table_cos: np.ndarray, table_sin: np.ndarray, stop_ids: tuple[int, ...], penalty: float,
           opts: DecodeOptions, text_of: Callable[[list[int]], str] | None = None,
           state: DecodeState | None = None,
           stop_check: Callable[[], bool] | None = None) -> Iterator[int]:
    """Yield generated ids one by one; `state` records finish reason and timings.

    prompt_ids: [S] int64; cos/sin: [S, D] for the prompt; table_cos/sin: [MAX, D] for decode steps.
    text_of: decodes ids to text, used for the tail-repetition stop.
    stop_check: called once per token; True ends generation with finish_reason 'cancelled'.
    """
    st = state if state is not None else DecodeState()
    s = int(prompt_ids.shape[0])
    on_device = bool(getattr(session, "selects", False))     # the graph applies the penalty and argmax
    t0 = time.perf_counter()
    if on_device:
        session.begin(prompt_ids, penalty)
    logits = session.prefill(prompt_ids, cos, sin)
    t1 = time.perf_counter()
    st.prefill_ms = (t1 - t0) * 1e3
    rp = None if on_device else RepetitionPenalty(session.vocab_size, penalty, prompt_ids)
    stops = set() if opts.ignore_stop else set(stop_ids)
    next_check = opts.tail_min_chars
    tok = session.first_token if on_device else -1          # on device: each step returns the next id
    for n in range(opts.max_new_tokens):
        if not on_device:
            tok = int(np.argmax(rp(logits)))
        if n == 0:
            st.first_token_ms = (time.perf_counter() - t1) * 1e3
        st.tokens.append(tok)
        pos = s + n                      # cache row the next step would write
        if tok in stops:
            st.finish_reason = FINISH_STOP
        elif n + 1 == opts.max_new_tokens:
            st.finish_reason = FINISH_LENGTH
        elif pos >= session.max_len:
            st.finish_reason = FINISH_CACHE
        elif stop_check is not None and stop_check():
            st.finish_reason = FINISH_CANCELLED
        elif opts.tail_repetition_stop and text_of is not None and len(st.tokens) * 4 >= next_check:
            text = text_of(st.tokens)
            if len(text) >= next_check:
                next_check = len(text) + opts.tail_check_every
                if tail_repeats(text, opts.tail_window, opts.tail_min_repeats):
                    st.finish_reason = FINISH_REPETITION
        yield tok                        # finish_reason is already set when this is the last token
        if st.finish_reason:
            break
        ts = time.perf_counter()
        if on_device:
            tok = session.step_token(tok, pos, table_cos[pos], table_sin[pos])
        else:
            rp.add(tok)
            logits = session.step(tok, pos, table_cos[pos], table_sin[pos])
        st.step_ms.append((time.perf_counter() - ts) * 1e3)
    st.decode_ms = (time.perf_counter() - t1) * 1e3
