"""Continuous batching at fixed shapes: N pages decode together in an N-slot artifact's KV cache.

`SlotScheduler` is the loop over edgeocr.decode's steps.  `admit` runs one page's preprocessing, vision and
prefill into a free slot (the other slots wait for that one step); `step` advances every live slot by one
token in a single decoder call and reports what each produced; a finished page frees its slot at once, so
the next page can take it.  Each page's tokens are those it would get decoding alone on the same artifact:
slots never read each other's rows, and a step's math for one row does not depend on the other rows.

OCRModel.stream / recognize / recognize_many and the daemon's engine all drive this one scheduler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from edgeocr import decode
from edgeocr.decode import DecodeOptions, Sequence


@dataclass(frozen=True)
class PageRequest:
    """What one page asks of the model."""

    image: object                     # path | bytes | numpy HxWx3 uint8 | PIL image
    task: str | None = None           # official task key; None with prompt=None: the default task
    prompt: str | None = None         # custom instruction instead of a task
    lang: str = "zh"                  # prompt language for task
    options: DecodeOptions = DecodeOptions()


@dataclass
class SlotEvent:
    tag: object                       # the caller's handle passed to admit()
    token_id: int
    text_delta: str                   # "" while an incomplete UTF-8 sequence is held back (or deltas off)
    result: "object | None" = None    # OCRResult on the page's last event


@dataclass
class _Page:
    """A page holding a slot."""

    tag: object
    seq: Sequence
    prep: object                      # edgeocr.model.Prepared
    task: str | None
    vision_ms: float
    t_start: float                    # perf_counter when admitted
    t_first: float = 0.0              # perf_counter when its first token was chosen
    prefix_offset: int = 0            # incremental detokenization (deltas on): tokens before this are
    read_offset: int = 0              # settled; tokens[prefix_offset:read_offset] gave the last text reported
    done: bool = False                # finished; its slot is freed once step() has reported that


class SlotScheduler:
    """Implements the engine seam used by recognize_many and the daemon (see module doc).

    Not thread-safe: one thread drives a scheduler, and a model has one scheduler in use at a time."""

    def __init__(self, model, deltas: bool = False):
        self.model, self.session = model, model.session
        self.slots = n = self.session.slots
        self.deltas = deltas                               # compute text deltas per token (streaming)
        self.pages: list[_Page | None] = [None] * n
        self._tokens = np.zeros((n,), np.int64)            # [N] each slot's last token
        self._pos = np.zeros((n,), np.int64)               # [N] its cache row
        self._cos = np.zeros((n, model.table_cos.shape[1]), np.float32)   # [N, D]
        self._sin = np.zeros_like(self._cos)
        self._live = np.zeros((n,), bool)                  # [N]
        self._next = np.zeros((n,), np.int64)              # [N] selected tokens
        self._pending: list[SlotEvent] = []                # first tokens of pages admitted since the last step

    # ------------------------------------------------------------ the seam
    def free(self) -> int:
        return self.slots - self.live()

    def live(self) -> int:
        """Slots in use: a page holds its slot until step() has reported its last event."""
        return sum(p is not None for p in self.pages)

    def idle(self) -> bool:
        return not self.live()

    def admit(self, request: PageRequest, tag) -> None:
        """Preprocess, encode and prefill `request` into a free slot.  Raises EdgeOCRError subclasses on bad
        input (nothing is admitted then).  Its first token is reported by the next step()."""
        if None not in self.pages:
            raise RuntimeError("admit() with no free slot")
        slot = self.pages.index(None)
        m = self.model
        t_start = time.perf_counter()
        request.options.validate()
        instruction, task = m.instruction(request.task, request.prompt, request.lang)
        prep = m.prepare(request.image)
        if prep.blank:                          # no ink: an empty result at once, reported by the next step()
            seq = Sequence(np.zeros(0, np.int64), request.options, frozenset(), 1.0, finish_reason=decode.FINISH_BLANK)
            page = _Page(tag, seq, prep, task, 0.0, t_start, t_first=time.perf_counter(), done=True)
            self.pages[slot] = page
            self._pending.append(SlotEvent(tag, None, "", self._result(page)))
            return
        ids = m.prompt_ids(instruction)
        cos, sin = m.rope_tables(ids)
        t0 = time.perf_counter()
        self.session.encode_image(prep.pixels)
        vision_ms = (time.perf_counter() - t0) * 1e3
        opts = request.options
        seq = Sequence(prompt_ids=ids, options=opts,
                       stop_ids=frozenset() if opts.ignore_stop else frozenset(m.stop_ids),
                       penalty=opts.repetition_penalty or m.artifact.repetition_penalty)
        tok = decode.prefill(self.session, slot, seq, cos, sin)
        page = _Page(tag, seq, prep, task, vision_ms, t_start, t_first=time.perf_counter())
        events: list[SlotEvent] = []
        self._emit(slot, page, tok, events)
        self.pages[slot] = page
        self._pending += events

    def step(self) -> list[SlotEvent]:
        """One decode step of every live slot; returns the tokens produced (first tokens of newly admitted
        pages included), with the result on each finished page's last event."""
        events, self._pending = self._pending, []
        for i, p in enumerate(self.pages):
            if p is not None and p.done:          # finished at admission (first token), reported now
                self.pages[i] = None
        live = self._live
        live[:] = [p is not None for p in self.pages]
        if not live.any():
            return events
        table_cos, table_sin = self.model.table_cos, self.model.table_sin
        for i, p in enumerate(self.pages):
            if p is not None:
                self._tokens[i], self._pos[i] = p.seq.tokens[-1], p.seq.next_pos
            else:
                self._tokens[i], self._pos[i] = 0, 0
        self._cos[:], self._sin[:] = table_cos[self._pos], table_sin[self._pos]
        t0 = time.perf_counter()
        decode.decode_one_token(self.session, [p.seq if p else None for p in self.pages], self._tokens,
                                self._pos, self._cos, self._sin, live, self._next)
        dt = (time.perf_counter() - t0) * 1e3
        for i in np.flatnonzero(live):
            page = self.pages[i]
            page.seq.step_ms.append(dt)
            self._emit(int(i), page, int(self._next[i]), events)
            if page.done:
                self.pages[i] = None
        return events

    def cancel(self, tag):
        """Free the slot holding `tag` now; its result has finish_reason "cancelled" (None: not held)."""
        for i, p in enumerate(self.pages):
            if p is not None and p.tag == tag:
                self.pages[i] = None
                if p.done:                        # finished at admission, not reported yet: report nothing
                    self._pending = [ev for ev in self._pending if ev.tag != tag]
                p.seq.finish_reason = decode.FINISH_CANCELLED
                return self._result(p)
        return None

    # ------------------------------------------------------------ internals
    def _emit(self, slot: int, page: _Page, tok: int, events: list[SlotEvent]) -> None:
        seq = page.seq
        seq.tokens.append(tok)
        seq.finish_reason = decode.finish_reason(seq, tok, self.session.cache_len, self.model.tokenizer.decode)
        delta = self._delta(page) if self.deltas else ""
        result = None
        if seq.finish_reason:
            page.done = True
            result = self._result(page)
        events.append(SlotEvent(page.tag, tok, delta, result))

    def _delta(self, page: _Page) -> str:
        """The text the newest token adds, decoding only a short window (incremental detokenization: the cost
        per token does not grow with the page); held back while it ends in an incomplete UTF-8 sequence."""
        decode_ids, toks = self.model.tokenizer.decode, page.seq.tokens
        before = decode_ids(toks[page.prefix_offset:page.read_offset])
        now = decode_ids(toks[page.prefix_offset:])
        if len(now) > len(before) and (not now.endswith("\ufffd") or page.seq.finish_reason):
            page.prefix_offset, page.read_offset = page.read_offset, len(toks)
            return now[len(before):]
        return ""

    def _result(self, page: _Page):
        seq = page.seq
        seq.decode_ms = (time.perf_counter() - page.t_first) * 1e3
        return self.model.result(seq, page.prep, page.task, page.vision_ms, page.t_start)
