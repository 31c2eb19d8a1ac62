"""The slot engine: N pages decode together in an N-slot artifact's KV cache (continuous batching at fixed
shapes).

`SlotScheduler` holds the per-page generation state and decodes through the session and token selection
strategy (edgeocr.selection) it is given.  `admit` takes a prepared `Page` (pixels, prompt, decoding
options) into a free slot: its vision graph and its prefill; `step` advances every live slot by one token
in a single decoder call and reports what each produced; a finished page frees its slot at once, so the
next page can take it.

Vision ahead (`vision_ahead`; EDGEOCR_VISION_AHEAD=1 turns it on by default, off otherwise): `admit` only
hands the page's vision to the session's vision worker, a thread that writes the embeddings into the slot's
own buffer while the other slots go on decoding (ONNX Runtime runs the vision session on its own CUDA
stream); the page's prefill runs between two steps once its vision is done.  Without it, the other slots
wait for the page's vision and prefill.  Either way, each page's tokens are those it would get decoding
alone on the same artifact: slots never read each other's rows, and a step's math for one row does not
depend on the other rows.

Prefill beside (`prefill_beside`, with vision ahead; EDGEOCR_PREFILL_BESIDE=1 where the session can): the
worker runs the page's prefill too, on a second decoder session bound to the same cache
(OrtSession.open_prefill_beside), so no admission pauses the other slots.  Meanwhile the step gives that slot
row S, just past its prompt's rows [0, S), which the page's own first step rewrites before reading it, so the
two never write the same row.

`drive` is the one loop over a scheduler (admit while slots are free, step, repeat): OCRModel.recognize,
stream and recognize_many, `edgeocr run` and the daemon's engine all run through it.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass

import numpy as np

from edgeocr import decode
from edgeocr.decode import DecodeOptions, FinishReason, Sequence
from edgeocr.errors import BackendError
from edgeocr.ort_options import VISION_AHEAD_ENV, vision_ahead_asked  # noqa: F401  (VISION_AHEAD_ENV: edgeocr.slots names it too)
from edgeocr.prepare import Prepared, Preparer
from edgeocr.result import drop_cut_character
from edgeocr.selection import Selection

log = logging.getLogger("edgeocr")


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
    page: Page | None = None          # until its prefill: what the prefill needs
    vision: Future | None = None      # its vision on the worker thread (vision ahead), None once prefilled
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
                 deltas: bool = False, selection: Selection | None = None, vision_ahead: bool | None = None,
                 prefill_beside: bool | None = None):
        self.session, self.preparer, self.tokenizer, self.results = session, preparer, tokenizer, results
        self.selection = selection if selection is not None else session.selection()
        if vision_ahead is None:          # off: on the H200 it did not beat waiting admission (docs/batching.md)
            vision_ahead = vision_ahead_asked()
        if vision_ahead and getattr(session, "vision_graph", False):
            # ONNX Runtime keeps a CUDA graph per thread: the worker would capture its own while the steps run
            log.warning("vision ahead is off for this scheduler: the session replays its vision as a CUDA graph "
                        "(EDGEOCR_VISION_GRAPH=1, the default for native-step artifacts with 8-bit vision weights "
                        "unless the model is loaded with vision_ahead or EDGEOCR_VISION_AHEAD=1), which runs on the "
                        "scheduler's thread")
            vision_ahead = False
        self.vision_ahead = vision_ahead
        self.prefill_beside = self._want_prefill_beside(prefill_beside)
        self._vision = vision_worker(session)              # one per session: visions run in admission order
        self._steps = 0                   # decode steps run: the first QUIET_STEPS run with vision idle
        self.failed: list[tuple[object, Exception]] = []   # (tag, error) of pages whose vision failed (drive)
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

    def _want_prefill_beside(self, asked: bool | None) -> bool:
        """Prefill beside (module doc): asked, or EDGEOCR_PREFILL_BESIDE=1 (then only where it can run)."""
        from_env = asked is None
        if from_env:
            asked = _env_on(PREFILL_BESIDE_ENV)
        if not asked:
            return False
        if not self.vision_ahead:
            why = "it needs vision ahead"
        elif not getattr(self.session, "prefill_beside_ok", False):
            why = f"the {type(self.session).__name__} cannot run a prefill beside its step"
        elif not hasattr(self.selection, "first_beside"):
            why = "its token selection is not the decoder graph's (export with --select-on-device)"
        else:
            why = ""
        if why:
            if from_env:
                log.debug("%s=1 ignored for this scheduler: %s", PREFILL_BESIDE_ENV, why)
                return False
            raise ValueError(f"prefill beside the step: {why}")
        try:
            self.session.open_prefill_beside()
        except BackendError as e:         # e.g. no device memory for the second decoder session
            if not from_env:
                raise
            log.warning("%s=1 ignored: %s", PREFILL_BESIDE_ENV, e)
            return False
        return True

    # ------------------------------------------------------------ the seam
    def free(self) -> int:
        return self.slots - self.live()

    def live(self) -> int:
        """Slots in use: a page holds its slot until step() has reported its last event."""
        return sum(p is not None for p in self.pages)

    def idle(self) -> bool:
        return not self.live()

    def decoding(self) -> int:
        """Slots whose page is prefilled and decoding (not waiting for its vision)."""
        return sum(p is not None and p.vision is None for p in self.pages)

    def admit(self, page: Page, tag) -> None:
        """Encode and prefill a prepared `page` into a free slot.  Its first token is reported by the next
        step().  A blank page (`prep.blank`) is not decoded: the next step() reports its empty result
        (finish_reason "blank", no token); where its blank check (on the preparer's worker) is still under way,
        its vision runs meanwhile and the check is read before its prefill, which it then skips."""
        if not isinstance(page, Page):
            raise TypeError(f"admit() takes a prepared Page, not {type(page).__name__} (OCRModel.page makes one)")
        if None not in self.pages:
            raise RuntimeError("admit() with no free slot")
        slot = self.pages.index(None)
        t_admit = time.perf_counter()
        if page.prep.blank_known() and page.prep.blank:   # no ink: an empty result, reported by the next step()
            self._finish_blank(slot, tag, page, t_admit, self._pending)
            return
        # a blank check still under way is read once the page's vision has run (the two overlap)
        seq = Sequence(prompt_ids=page.prompt.ids, options=page.options, stop_ids=page.stop_ids,
                       penalty=page.penalty, next_check=page.options.tail_min_chars)
        held = _Slot(tag, seq, page.prep, page.task, 0.0, t_admit, page=page)
        # a vision that may capture its CUDA graph runs here, with nothing else in flight (see QUIET_STEPS)
        ahead = not _pending(self.session, "vision_capture_pending")
        if self.prefill_beside and ahead:   # vision and prefill on the worker; the step decodes the others
            held.vision = self._vision.submit(self._encode_and_prefill, page, slot)
            self.pages[slot] = held       # its first token reported by a later step(), once both are done
            return
        if self.vision_ahead and ahead:
            held.vision = self._vision.submit(self._encode, page.prep, slot)
            self.pages[slot] = held       # prefilled by a later step(), once its vision is done
            return
        self._vision.drain()              # a vision still in flight (a cancelled page's) may write this slot
        held.vision_ms = self._encode(page.prep, slot)
        if page.prep.blank:
            self._finish_blank(slot, tag, page, t_admit, self._pending, held.vision_ms)
            return
        self._prefill(slot, held, self._pending)
        self.pages[slot] = held

    def _finish_blank(self, slot: int, tag, page: Page, t_admit: float, events: list[SlotEvent],
                      vision_ms: float = 0.0) -> None:
        """A page with no ink takes `slot` finished, with an empty result (finish_reason "blank", no token)
        reported by the next step(); the model's prefill and decode are not run for it (its vision has run
        where the blank check was still under way at admission: vision_ms)."""
        seq = Sequence(prompt_ids=_NO_PROMPT, options=page.options, stop_ids=frozenset(), penalty=1.0,
                       finish_reason=FinishReason.BLANK)
        held = _Slot(tag, seq, page.prep, page.task, vision_ms, t_admit, t_first=time.perf_counter(), done=True)
        self.pages[slot] = held
        events.append(SlotEvent(tag, None, "", self._result(held)))

    def _encode(self, prep: Prepared, slot: int) -> float:
        """The page's vision graph into `slot`'s image buffer; its wall time, ms.  A preparer that letterboxes at
        admission (the device path) reports that part as the page's "letterbox" timing: preprocessing, not vision."""
        t0 = time.perf_counter()
        pixels = self.preparer.pixels(prep)
        t1 = time.perf_counter()
        if getattr(self.preparer, "letterbox_at_admission", False):      # any object with __call__ and pixels
            prep.timings_ms["letterbox"] = (t1 - t0) * 1e3
        self.session.encode_image(pixels, slot)
        return (time.perf_counter() - t1) * 1e3

    def _encode_and_prefill(self, page: Page, slot: int) -> tuple[float, float, int, float]:
        """Prefill beside, on the worker: the page's vision, then its prefill on the session's second decoder
        session.  Returns (vision ms, prefill ms, first token, perf_counter when it was chosen); for a blank page
        (not prefilled) (vision ms, 0, -1, 0)."""
        vision_ms = self._encode(page.prep, slot)
        if page.prep.blank:                   # no ink: no prefill (_start_ready finishes the page)
            return vision_ms, 0.0, -1, 0.0
        t0 = time.perf_counter()
        tok = self.selection.first_beside(slot, page.prompt.ids, page.penalty, page.prompt.cos, page.prompt.sin)
        t1 = time.perf_counter()
        return vision_ms, (t1 - t0) * 1e3, tok, t1

    def _prefill(self, slot: int, held: _Slot, events: list[SlotEvent]) -> None:
        """Prefill `held`'s prompt into `slot` (its image is in the slot's buffer) and emit its first token."""
        page, seq = held.page, held.seq
        if _pending(self.session, "prefill_capture_pending", slot, len(seq.prompt_ids)):
            self._vision.drain()              # a CUDA graph may be captured: no vision in flight meanwhile
        t_prefill = time.perf_counter()
        tok = self.selection.first(slot, seq.prompt_ids, seq.penalty, page.prompt.cos, page.prompt.sin)
        t_first = time.perf_counter()
        seq.prefill_ms = (t_first - t_prefill) * 1e3
        self._started(held, tok, t_first, events)

    def _started(self, held: _Slot, tok: int, t_first: float, events: list[SlotEvent]) -> None:
        """A prefilled page: its first token `tok`, chosen at `t_first`, joins the decoding slots."""
        held.t_first, held.page = t_first, None
        held.seq.first_token_ms = (t_first - held.t_admit) * 1e3
        self._emit(held, tok, events)

    def _start_ready(self, events: list[SlotEvent]) -> None:
        """Vision ahead: prefill every page whose vision has finished, in admission order; when no slot is
        decoding, wait for the first one first.  A page whose vision or prefill failed leaves its slot, its error
        in `failed`."""
        if self._steps < getattr(self.session, "capture_steps", QUIET_STEPS):
            self._vision.drain()                  # cancelled pages' visions too: a graph may be captured next
        waiting = sorted((i for i, p in enumerate(self.pages) if p is not None and p.vision is not None),
                         key=lambda i: self.pages[i].t_admit)
        if not waiting:
            return
        if self._steps < getattr(self.session, "capture_steps", QUIET_STEPS):   # a CUDA graph may be captured
            # in these: vision must be idle
            wait_futures([self.pages[i].vision for i in waiting])
        elif not any(p is not None and p.vision is None for p in self.pages):    # nothing else to step
            wait_futures([self.pages[waiting[0]].vision])
        for i in waiting:
            held = self.pages[i]
            if not held.vision.done():
                continue
            try:
                done = held.vision.result()
                held.vision = None
                if held.page.prep.blank:          # no ink (checked while its vision ran): no prefill
                    self._finish_blank(i, held.tag, held.page, held.t_admit, events,
                                       done[0] if self.prefill_beside else done)
                    continue
                if self.prefill_beside:           # prefilled on the worker too: its first token is ready
                    held.vision_ms, held.seq.prefill_ms, tok, t_first = done
                    self._started(held, tok, t_first, events)
                    continue
                held.vision_ms = done
                self._prefill(i, held, events)
            except Exception as e:                # an admission error: reported through `failed` (drive)
                self.pages[i] = None
                self.failed.append((held.tag, e))

    def step(self) -> list[SlotEvent]:
        """One decode step of every live slot; returns the tokens produced (first tokens of newly admitted
        pages included), with the result on each finished page's last event."""
        events, self._pending = self._pending, []
        if self.vision_ahead:                     # prefill the pages whose vision is done (without it, admit
            self._start_ready(events)             # waited for any vision in flight and prefilled at once)
        for i, p in enumerate(self.pages):
            if p is not None and p.done:          # finished on its first token (at admission or just now):
                self.pages[i] = None              # its events are in `events`
        live = self._live
        live[:] = [p is not None and p.vision is None for p in self.pages]
        if not live.any():
            return events
        for i, p in enumerate(self.pages):
            if live[i]:
                self._tokens[i], self._pos[i] = p.seq.tokens[-1], p.seq.next_pos
            elif self.prefill_beside and p is not None:   # being prefilled beside this step (rows [0, S)): its
                self._tokens[i], self._pos[i] = 0, len(p.seq.prompt_ids)      # row is S, which its first step
                #                                   rewrites before reading it (and attention reads S + 1 rows)
            else:                                 # idle, or its vision still running: row 0, rewritten by its prefill
                self._tokens[i], self._pos[i] = 0, 0
        np.take(self.table_cos, self._pos, axis=0, out=self._cos)   # gathered into the buffers: no allocation
        np.take(self.table_sin, self._pos, axis=0, out=self._sin)
        t0 = time.perf_counter()
        self.selection.next(self._tokens, self._pos, self._cos, self._sin, live, self._next)
        self._steps += 1
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
                if p.vision is not None:          # its vision may still run: the worker keeps it in flight
                    p.t_first = time.perf_counter()   # (the next vision into this slot queues behind it)
                    p.vision.add_done_callback(_log_failure)
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
        if held.seq.finish_reason:           # a character the page's end cut is not written (nor in the result)
            now = drop_cut_character(now, toks, self.tokenizer, held.seq.finish_reason)
        if len(now) > len(before) and not now.endswith("\ufffd"):
            held.prefix_offset, held.read_offset = held.read_offset, len(toks)
            return now[len(before):]
        return ""

    def _result(self, held: _Slot):
        seq = held.seq
        seq.decode_ms = (time.perf_counter() - held.t_first) * 1e3
        return self.results(seq, held.prep, held.task, held.vision_ms, held.t_admit)


_END = object()
# ONNX Runtime captures a decode step's CUDA graph on the third run of its graph id (two regular runs first),
# in cudaStreamCaptureModeGlobal: a CUDA call from the vision thread meanwhile would break the capture, so a
# scheduler's first QUIET_STEPS steps (a session's `capture_steps` where it has several step graphs) run with no
# vision in flight.
QUIET_STEPS = 3
PREFILL_BESIDE_ENV = "EDGEOCR_PREFILL_BESIDE"  # "1": with vision ahead, prefills run beside the step too


def _pending(session, hook: str, *args) -> bool:
    """A session's capture hook (edgeocr.backends.base.Session); False for a test double without it."""
    fn = getattr(session, hook, None)
    return bool(fn(*args)) if fn is not None else False


def _env_on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class VisionWorker:
    """A session's vision thread: pages' visions run one at a time in the order given, and the ones still in
    flight are known (a cancelled page's too), so that nothing else uses the slot's image buffer or captures a
    CUDA graph meanwhile.  One per session, shared by every scheduler over it; driven by one thread."""

    def __init__(self):
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: list[Future] = []

    def submit(self, fn, *args) -> Future:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="edgeocr-vision")
        fut = self._pool.submit(fn, *args)
        self._inflight = [f for f in self._inflight if not f.done()] + [fut]
        return fut

    def drain(self) -> None:
        """Wait until no vision is in flight."""
        if self._inflight:
            wait_futures(self._inflight)
            self._inflight = []


_WORKERS: "weakref.WeakKeyDictionary[object, VisionWorker]" = weakref.WeakKeyDictionary()


def vision_worker(session) -> VisionWorker:
    """The session's VisionWorker (made on first use; it goes with the session)."""
    w = _WORKERS.get(session)
    if w is None:
        w = _WORKERS[session] = VisionWorker()
    return w


def _log_failure(fut: Future) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("a cancelled page's vision failed: %s", fut.exception())
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
        try:
            events = sched.step()
        except Exception:
            sched.failed.clear()          # every live page fails with the step; none is reported twice
            raise
        while sched.failed:               # vision ahead: a page whose vision failed is an admission error
            tag, e = sched.failed.pop(0)
            if on_admit_error is None:
                raise e
            on_admit_error(tag, e)
        yield events
