"""Jobs and admission: a bounded queue between the HTTP handlers (event loop) and the engine thread.

A handler reserves a place *before* it reads the body, so a full queue is refused from the headers
alone (no body buffered, no image decoded); the reservation becomes a queued job once the request
is parsed and its image header checked, or is given back on any refusal.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
import time
from dataclasses import dataclass, field

from edgeocr.serve.errors import unavailable

# items a job's event queue carries to its handler (engine thread -> event loop)
TOKEN = "token"        # ("token", token_id, text_delta)
DONE = "done"          # ("done", OCRResult)
ERROR = "error"        # ("error", HTTPError)
GONE = "gone"          # ("gone",): the handler's own note that its client disconnected


@dataclass(eq=False)
class Job:
    """One accepted request.  Identity-hashed: it is the tag the scheduler hands back in its events."""

    id: str                                   # request id (also in the log line)
    request: object                           # engine.PageRequest
    stream: bool                              # the handler wants every token
    deadline: float                           # time.monotonic() by which it must finish
    loop: asyncio.AbstractEventLoop           # the handler's event loop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # TOKEN..., then DONE or ERROR
    enqueued: float = field(default_factory=time.monotonic)
    started: float = 0.0                      # monotonic time it got a slot (0: never)
    gone: bool = False                        # the client left: drop it if queued, cancel it if running
    chat_model: str = "hunyuanocr"            # OpenAI requests: the model name to echo back
    prepared: object = None                   # Future of its edgeocr.slots.Page, made on the model's worker pool

    def post(self, *item) -> None:
        """Hand an event to the handler; callable from any thread."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:      # the event loop is closed: nobody is waiting any more
            pass


class Ticket:
    """A reserved place in the queue, held while the request body arrives and is parsed."""

    __slots__ = ("admission", "spent")

    def __init__(self, admission: "Admission"):
        self.admission = admission
        self.spent = False           # submitted or released

    def release(self) -> None:
        self.admission._release(self)


class Admission:
    """Bounded waiting room: `queue_size` places beyond the engine's slots.  Reservations, queued jobs
    and jobs in the engine all count, so `queue_size + slots` requests are accepted at once at most."""

    def __init__(self, queue_size: int, slots: int = 1):
        self.queue_size = queue_size
        self.slots = slots                     # pages the engine runs at once (for Retry-After)
        self.cond = threading.Condition()
        self.waiting: collections.deque[Job] = collections.deque()
        self.reserved = 0
        self.state = "loading"                 # loading | ready | draining
        self.service_s = 2.0                   # moving average of a job's time in a slot, seconds
        self.running = 0                       # jobs taken by the engine and not finished (admitting or in a slot)

    # ------------------------------------------------------------------ handler side (event loop)
    def reserve(self) -> Ticket:
        with self.cond:
            if self.state == "draining":
                raise unavailable("shutting_down", "the server is shutting down", 5)
            if self.state != "ready":
                raise unavailable("not_ready", "the model is still loading", 2)
            if self.reserved + len(self.waiting) + self.running >= self.queue_size + self.slots:
                raise unavailable("overloaded", f"queue full ({self.queue_size} waiting)", self.retry_after_s())
            self.reserved += 1
            return Ticket(self)

    def submit(self, ticket: Ticket, job: Job) -> None:
        with self.cond:
            if ticket.spent:
                raise RuntimeError("ticket used twice")
            ticket.spent = True
            self.reserved -= 1
            if self.state == "draining":
                raise unavailable("shutting_down", "the server is shutting down", 5)
            self.waiting.append(job)
            self.cond.notify_all()

    def _release(self, ticket: Ticket) -> None:
        with self.cond:
            if not ticket.spent:
                ticket.spent = True
                self.reserved -= 1

    def retry_after_s(self) -> float:
        """Rough time until a place frees up: the work ahead divided over the slots."""
        ahead = len(self.waiting) + self.reserved + self.running
        return min(60.0, max(1.0, self.service_s * ahead / max(1, self.slots)))

    def depth(self) -> int:
        return len(self.waiting)

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    # ------------------------------------------------------------------ engine side
    def open(self, slots: int) -> None:
        with self.cond:
            self.slots = slots
            if self.state == "loading":
                self.state = "ready"

    def close(self) -> None:
        """Refuse new requests from now on (503 shutting_down); queued ones stay for the drain."""
        with self.cond:
            self.state = "draining"
            self.cond.notify_all()

    def take(self) -> Job | None:
        with self.cond:
            if not self.waiting:
                return None
            self.running += 1
            return self.waiting.popleft()

    def peek(self, n: int) -> list[Job]:
        """The first `n` waiting jobs, left in the queue (the engine prepares them before their turn)."""
        with self.cond:
            return list(itertools.islice(self.waiting, n))

    def leave(self) -> None:
        """A job the engine took is finished (result, error, cancel or drop)."""
        with self.cond:
            self.running -= 1

    def take_all(self) -> list[Job]:
        with self.cond:
            jobs = list(self.waiting)
            self.waiting.clear()
            return jobs

    def wait_for_work(self, timeout: float) -> None:
        with self.cond:
            if not self.waiting:
                self.cond.wait(timeout)

    def record_service(self, seconds: float) -> None:
        self.service_s = 0.8 * self.service_s + 0.2 * seconds
