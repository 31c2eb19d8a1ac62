"""One engine thread that keeps a model's slots busy for many callers: pages in through a bounded queue, a
Future per page out.

    engine = QueueEngine(model)                       # starts the thread
    fut = engine.submit(model.page(image, task=...), tag=call)   # on the caller's thread; waits while the queue is full
    fut.result()                                      # OCRResult, or the page's error

The thread drives one edgeocr.slots.SlotScheduler through edgeocr.slots.drive for its whole life.  A freed slot
takes the next queued page whoever queued it, so the pages of several callers decode together and the slots do
not drain when one caller's pages run out (edgeocr.distributed's PageActor: one Ray actor call per caller, two
calls in flight).  Pages are prepared (OCRModel.page) on the callers' threads, never on this one; the queue holds
at most `depth` prepared pages, so memory stays bounded however many pages the callers have.

Failures stay with their page: an admission error (the page's vision) fails that page's future; when a decode step
fails, every page that was live is run again alone, one after the other, so only the page that makes the step fail
ends with the error.  `close` (also on garbage collection of the owner) cancels what is live and fails what is
queued with EngineClosed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from edgeocr.errors import EdgeOCRError
from edgeocr.slots import Page, drive

log = logging.getLogger("edgeocr")

TICK_S = 0.5          # longest wait on the queue before the thread looks at its stop flag again


class EngineClosed(EdgeOCRError):
    """The engine was closed (or its thread ended) before the page was recognized."""


class PageFuture(Future):
    """A page's OCRResult or its exception, and when the engine settled it."""

    finished_at: float | None = None              # time.time() when the result or the error was set


@dataclass(eq=False)
class Ticket:
    """A queued page: the scheduler's tag for it (compared by identity)."""

    page: Page
    tag: object                                   # the caller's: which call the page belongs to
    future: PageFuture = field(default_factory=PageFuture)   # OCRResult, or the page's exception

    def settle(self, result=None, error: BaseException | None = None) -> None:
        self.future.finished_at = time.time()     # before the waiter wakes
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


class QueueEngine:
    """A model's engine thread over one scheduler, fed by a bounded queue (see module doc).  The model must not
    be used by another thread while the engine holds pages (they share the KV cache)."""

    def __init__(self, model, depth: int | None = None):
        """model: an edgeocr.model.OCRModel; depth: prepared pages that may wait in the queue (default: the
        model's slots, enough to fill every slot freed at once)."""
        if depth is not None and depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.sched = model.scheduler()
        self._queue: queue.Queue[Ticket] = queue.Queue(maxsize=depth or model.slots)
        self._held: list[Ticket] = []             # admitted, not finished: in admission order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edgeocr-queue-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ callers' threads
    def submit(self, page: Page, tag=None) -> PageFuture:
        """Queue a prepared page (blocks while the queue is full); its future gives the OCRResult or raises the
        page's error, and says when it was finished.  Raises EngineClosed once the engine is closed."""
        if not isinstance(page, Page):
            raise TypeError(f"submit() takes a prepared Page, not {type(page).__name__} (OCRModel.page makes one)")
        ticket = Ticket(page, tag)
        while True:
            if self._stop.is_set() or not self._thread.is_alive():
                raise EngineClosed("the page engine is closed: no page is taken")
            try:
                self._queue.put(ticket, timeout=TICK_S)
            except queue.Full:
                continue
            if self._stop.is_set():               # closed meanwhile: the thread may have emptied the queue already
                self._fail_queued()
            return ticket.future

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the thread: live pages are cancelled and every page not finished fails with EngineClosed."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------------ the engine thread
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    for events in drive(self.sched, self._feed(), self._admit_failed):
                        for ev in events:
                            if ev.result is not None and ev.tag in self._held:
                                self._held.remove(ev.tag)
                                ev.tag.settle(ev.result)
                        if self._stop.is_set():
                            break
                except Exception as e:
                    self._rerun_alone(e)
        except BaseException:
            log.exception("the page engine stopped")
            raise
        finally:
            self._fail_all()

    def _feed(self):
        """drive()'s feed: (ticket, page) for the next queued page; None when none is queued (waiting up to a
        tick first when no slot is live).  Ends when the engine is closed."""
        while not self._stop.is_set():
            try:
                ticket = self._queue.get(timeout=TICK_S) if self.sched.idle() else self._queue.get_nowait()
            except queue.Empty:
                yield None
                continue
            self._held.append(ticket)
            yield ticket, ticket.page

    def _admit_failed(self, ticket: Ticket, e: Exception) -> None:
        self._held.remove(ticket)
        ticket.settle(error=e)

    def _rerun_alone(self, e: Exception) -> None:
        """A decode step failed with these pages live: run each again alone; the one that fails alone keeps its
        error."""
        held, self._held = self._held, []
        log.warning("a decode step failed with %d page(s) live (%s: %s); those again one by one", len(held),
                    type(e).__name__, e)
        for t in held:
            self.sched.cancel(t)
        for t in held:
            if self._stop.is_set():
                self._held.extend(h for h in held if not h.future.done())    # failed by _fail_all
                return
            try:
                result = None
                for events in drive(self.sched, [(t, t.page)]):
                    result = next((ev.result for ev in events if ev.tag is t and ev.result is not None), result)
                t.settle(result)
            except Exception as alone:
                self.sched.cancel(t)
                t.settle(error=alone)

    def _fail_all(self) -> None:
        for t in self._held:
            self.sched.cancel(t)
        held, self._held = self._held, []
        for t in held:
            if not t.future.done():
                t.settle(error=EngineClosed("the page engine closed before this page was recognized"))
        self._fail_queued()

    def _fail_queued(self) -> None:
        """Fail every page still queued (each is taken from the queue once, by whichever thread gets it)."""
        while True:
            try:
                t = self._queue.get_nowait()
            except queue.Empty:
                return
            t.settle(error=EngineClosed("the page engine closed before this page was recognized"))
