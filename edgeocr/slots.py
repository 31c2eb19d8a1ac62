"""The slot engine: N pages decode together in an N-slot artifact's KV cache (continuous batching at fixed
shapes).

`SlotScheduler` holds the per-page generation state and runs edgeocr.decode's steps over the session it is
given.  `admit` takes a prepared `Page` (pixels, prompt, decoding options) into a free slot: vision and
prefill, the other slots waiting for that one call; `step` advances every live slot by one token in a single
decoder call and reports what each produced; a finished page frees its slot at once, so the next page can
take it.  Each page's tokens are those it would get decoding alone on the same artifact: slots never read
each other's rows, and a step's math for one row does not depend on the other rows.

`drive` is the one loop over a scheduler (admit while slots are free, step, repeat): OCRModel.recognize,
stream and recognize_many, `edgeocr run` and the daemon's engine all run through it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from edgeocr import decode
from edgeocr.decode import DecodeOptions, FinishReason, Sequence
from edgeocr.prepare import Prepared, Preparer
from edgeocr.selection import Selection


@dataclass(frozen=True)
class PageRequest:
    """What one page asks of the model (before it is prepared)."""

    image: object                     # path | bytes | numpy HxWx3 uint8 | PIL image | Prepared
    task: str | None = None           # official task key; None with prompt=None: the default task
    prompt: str | None = None         # custom instruction instead of a task
    lang: str = "zh"                  # prompt language for task
    options: DecodeOptions = DecodeOptions()


@dataclass(frozen=True)
class Prompt:
    """A page's prompt: ids and their XD-RoPE tables (the same for every page with the same instruction)."""

    ids: np.ndarray                   # [S] int64, image slots included
    cos: np.ndarray                   # [S, D] float32
    sin: np.ndarray                   # [S, D] float32


@dataclass(frozen=True)
class Page:
    """A page ready for admission: nothing left to decode, parse or tokenize."""

    prep: Prepared                    # the image, prepared on a worker
    prompt: Prompt
    task: str | None                  # task key, or None for a custom prompt
    options: DecodeOptions            # validated
    stop_ids: frozenset[int]          # empty with options.ignore_stop
    penalty: float                    # repetition penalty in force


@dataclass
class SlotEvent:
    tag: object                       # the caller's handle passed to admit()
    token_id: int | None              # None on a result-only event (a blank page, a cancelled page)
    text_delta: str                   # "" while an incomplete UTF-8 sequence is held back (or deltas off)
    result: "object | None" = None    # OCRResult on the page's last event


@dataclass
class _Slot:
    """A page holding a slot: its generation state."""

    tag: object
    seq: Sequence
    prep: Prepared
    task: str | None
    vision_ms: float
    t_admit: float                    # perf_counter when its admission began
    t_first: float = 0.0              # perf_counter when its first token was chosen
    prefix_offset: int = 0            # incremental detokenization (deltas on): tokens before this are
    read_offset: int = 0              # settled; tokens[prefix_offset:read_offset] gave the last text reported
    done: bool = False                # finished; its slot is freed once step() has reported that


class SlotScheduler:
    """Admits prepared pages into the session's slots and steps them (see module doc).

    Collaborators, given explicitly: `session` (edgeocr.backends.base.Session), `selection` (its token
    selection strategy, edgeocr.selection; default: the one the session's artifact needs), `preparer` (its
    `pixels` runs at admission: the device strategy's graph), `tokenizer` (stop checks on text, streaming
    deltas), `results` (finished sequence -> OCRResult), `text_rope` ((cos, sin) [cache_len, D] float32 each:
    the RoPE rows of generated tokens).  Not thread-safe: one thread drives a scheduler."""

    def __init__(self, session, preparer: Preparer, tokenizer, results: Callable, text_rope: tuple,
                 deltas: bool = False, selection: Selection | None = None):
        self.session, self.preparer, self.tokenizer, self.results = session, preparer, tokenizer, results
        self.selection = selection if selection is not None else session.selection()
        self.table_cos, self.table_sin = text_rope
        self.slots = n = session.slots
        self.deltas = deltas                               # compute text deltas per token (streaming)
        self.pages: list[_Slot | None] = [None] * n
        self._tokens = np.zeros((n,), np.int64)            # [N] each slot's last token
        self._pos = np.zeros((n,), np.int64)               # [N] its cache row
        self._cos = np.zeros((n, self.table_cos.shape[1]), np.float32)   # [N, D]
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

    def admit(self, page: Page, tag) -> None:
        """Encode and prefill a prepared `page` into a free slot.  Its first token is reported by the next
        step().  A blank page (`prep.blank`) is finished here without running the model: the next step()
        reports its empty result (finish_reason "blank", no token)."""
        if not isinstance(page, Page):
            raise TypeError(f"admit() takes a prepared Page, not {type(page).__name__} (OCRModel.page makes one)")
        if None not in self.pages:
            raise RuntimeError("admit() with no free slot")
        slot = self.pages.index(None)
        t_admit = time.perf_counter()
        if page.prep.blank:                   # no ink: an empty result at once, reported by the next step()
            seq = Sequence(prompt_ids=_NO_PROMPT, options=page.options, stop_ids=frozenset(), penalty=1.0,
                           finish_reason=FinishReason.BLANK)
            held = _Slot(tag, seq, page.prep, page.task, 0.0, t_admit, t_first=time.perf_counter(), done=True)
            self.pages[slot] = held
            self._pending.append(SlotEvent(tag, None, "", self._result(held)))
            return
        self.session.encode_image(self.preparer.pixels(page.prep))
        vision_ms = (time.perf_counter() - t_admit) * 1e3
        seq = Sequence(prompt_ids=page.prompt.ids, options=page.options, stop_ids=page.stop_ids,
                       penalty=page.penalty, next_check=page.options.tail_min_chars)
        t_prefill = time.perf_counter()
        tok = self.selection.first(slot, seq.prompt_ids, seq.penalty, page.prompt.cos, page.prompt.sin)
        seq.prefill_ms = (time.perf_counter() - t_prefill) * 1e3
        held = _Slot(tag, seq, page.prep, page.task, vision_ms, t_admit, t_first=time.perf_counter())
        events: list[SlotEvent] = []
        self._emit(held, tok, events)
        self.pages[slot] = held
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
        for i, p in enumerate(self.pages):
            if p is not None:
                self._tokens[i], self._pos[i] = p.seq.tokens[-1], p.seq.next_pos
            else:
                self._tokens[i], self._pos[i] = 0, 0
        np.take(self.table_cos, self._pos, axis=0, out=self._cos)   # gathered into the buffers: no allocation
        np.take(self.table_sin, self._pos, axis=0, out=self._sin)
        t0 = time.perf_counter()
        self.selection.next(self._tokens, self._pos, self._cos, self._sin, live, self._next)
        dt = (time.perf_counter() - t0) * 1e3
        for i in np.flatnonzero(live):
            held = self.pages[i]
            held.seq.step_ms.append(dt)
            self._emit(held, int(self._next[i]), events)
            if held.done:
                self.pages[i] = None
        return events

    def cancel(self, tag):
        """Free the slot holding `tag` now; its result has finish_reason "cancelled" (None: not held)."""
        for i, p in enumerate(self.pages):
            if p is not None and p.tag == tag:
                self.pages[i] = None
                if p.done:                        # finished at admission, not reported yet: report nothing
                    self._pending = [ev for ev in self._pending if ev.tag != tag]
                p.seq.finish_reason = FinishReason.CANCELLED
                return self._result(p)
        return None

    # ------------------------------------------------------------ internals
    def _emit(self, held: _Slot, tok: int, events: list[SlotEvent]) -> None:
        seq = held.seq
        seq.tokens.append(tok)
        seq.finish_reason = decode.finish_reason(seq, tok, self.session.cache_len, self.tokenizer.decode)
        delta = self._delta(held) if self.deltas else ""
        result = None
        if seq.finish_reason:
            held.done = True
            result = self._result(held)
        events.append(SlotEvent(held.tag, tok, delta, result))

    def _delta(self, held: _Slot) -> str:
        """The text the newest token adds, decoding only a short window (incremental detokenization: the cost
        per token does not grow with the page); held back while it ends in an incomplete UTF-8 sequence."""
        decode_ids, toks = self.tokenizer.decode, held.seq.tokens
        before = decode_ids(toks[held.prefix_offset:held.read_offset])
        now = decode_ids(toks[held.prefix_offset:])
        if len(now) > len(before) and (not now.endswith("\ufffd") or held.seq.finish_reason):
            held.prefix_offset, held.read_offset = held.read_offset, len(toks)
            return now[len(before):]
        return ""

    def _result(self, held: _Slot):
        seq = held.seq
        seq.decode_ms = (time.perf_counter() - held.t_first) * 1e3
        return self.results(seq, held.prep, held.task, held.vision_ms, held.t_admit)


_END = object()
_NO_PROMPT = np.zeros(0, np.int64)     # a blank page's: the model never saw it
_NO_PROMPT.flags.writeable = False


def drive(sched: SlotScheduler, feed: Iterable, on_admit_error: Callable[[object, Exception], None] | None = None
          ) -> Iterator[list[SlotEvent]]:
    """The loop: admit pages from `feed` while slots are free, step every live slot, yield each step's events;
    return once `feed` is exhausted and every slot is idle.

    feed: (tag, Page) items, or None for "nothing to admit now" (the loop steps what is live; a feed that
    says None while the scheduler is idle waits for work itself).  It is pulled only while a slot is free.
    An admission error goes to on_admit_error(tag, error) and the loop goes on; without it, it is raised.
    The consumer may cancel pages between two yields; stopping the iteration leaves live pages in their slots.
    """
    feed = iter(feed)
    exhausted = False
    while True:
        while not exhausted and sched.free():
            item = next(feed, _END)
            if item is _END:
                exhausted = True
            if item is None or item is _END:
                break
            tag, page = item
            try:
                sched.admit(page, tag)
            except Exception as e:
                if on_admit_error is None:
                    raise
                on_admit_error(tag, e)
        if sched.idle():
            if exhausted:
                return
            yield []                      # nothing live: the consumer gets control back between two pulls
            continue
        yield sched.step()
