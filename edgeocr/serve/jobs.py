"""Jobs and admission: a bounded queue between the HTTP handlers (event loop) and the engine thread.

A handler reserves a place *before* it reads the body, so a full queue is refused from the headers
alone (no body buffered, no image decoded); the reservation becomes a queued job once the request
is parsed and its image header checked, or is given back on any refusal.

A job then moves through `JobState`, and only through `Admission.move`:

    QUEUED ──► ADMITTING ──► RUNNING ──► DONE
       │           │            │
       └───────────┴────────────┴──────► CANCELLED (client gone, deadline, shutdown) | FAILED

QUEUED: accepted, waiting for a slot (its page is prepared on the model's worker pool meanwhile);
ADMITTING: taken by the engine and handed to the scheduler's admit (vision + prefill); RUNNING: holds a slot.
Every count the daemon reports (queue depth, jobs in the engine, slots busy, accepted jobs, the cancel and
token metrics, the service time behind Retry-After) is derived from the states or changed by a move: nothing
is counted by hand.
"""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from dataclasses import dataclass, field

from edgeocr.serve.errors import unavailable

# items a job's event queue carries to its handler (engine thread -> event loop)
TOKEN = "token"        # ("token", token_id, text_delta)
DONE = "done"          # ("done", OCRResult)
ERROR = "error"        # ("error", HTTPError)
GONE = "gone"          # ("gone",): the handler's own note that its client disconnected


class JobState(enum.Enum):
    QUEUED = "queued"            # accepted, waiting for a slot (its page may be preparing on the worker pool)
    ADMITTING = "admitting"      # taken by the engine, handed to the scheduler's admit
    RUNNING = "running"          # holds a slot, decoding
    DONE = "done"                # its result was produced
    CANCELLED = "cancelled"      # stopped: client gone, deadline or shutdown (Job.reason)
    FAILED = "failed"            # refused while prepared or admitted, or the engine failed

    def __str__(self) -> str:
        return self.value


QUEUED, ADMITTING, RUNNING = JobState.QUEUED, JobState.ADMITTING, JobState.RUNNING
CANCELLED, FAILED = JobState.CANCELLED, JobState.FAILED
MOVES = {QUEUED: {ADMITTING, CANCELLED, FAILED},          # the only legal transitions
         ADMITTING: {RUNNING, CANCELLED, FAILED},
         RUNNING: {JobState.DONE, CANCELLED, FAILED}}
IN_ENGINE = (ADMITTING, RUNNING)


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
    taken: float = 0.0                        # monotonic time the engine took it from the queue (0: never)
    started: float = 0.0                      # monotonic time it got a slot, its vision and prefill done (0: never)
    gone: bool = False                        # the client left: drop it if queued, cancel it if running
    chat_model: str = "hunyuanocr"            # OpenAI requests: the model name to echo back
    prepared: object = None                   # Future of its edgeocr.slots.Page, made on the model's worker pool
    state: JobState = QUEUED                  # changed by Admission.move only
    reason: str | None = None                 # why it was cancelled (metrics.CANCEL_REASONS)

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
    """Bounded waiting room: `queue_size` places beyond the engine's slots.  Reservations and accepted jobs
    (queued, admitting or running) all count, so `queue_size + slots` requests are accepted at once at most.
    It holds every accepted, unfinished job; `move` is the one place a job's state changes."""

    def __init__(self, queue_size: int, slots: int = 1, metrics=None):
        self.queue_size = queue_size
        self.slots = slots                     # pages the engine runs at once (for Retry-After)
        self.metrics = metrics                 # serve.metrics.Metrics (cancel and token counters), or None
        self.cond = threading.Condition()
        self.live: dict[Job, None] = {}        # accepted, not finished, in the order they were accepted
        self.reserved = 0                      # tickets: places held while a body arrives (not jobs yet)
        self.state = "loading"                 # loading | ready | draining
        self.service_s = 2.0                   # moving average of a job's time in a slot, seconds

    # ------------------------------------------------------------------ states and the counts derived from them
    def move(self, job: Job, to: JobState, reason: str | None = None, result=None) -> None:
        """The one transition: checks it is legal, stamps the job, updates the metrics; a finished job leaves.
        `result`: the OCRResult it ended with, if any (its tokens are counted)."""
        with self.cond:
            if to not in MOVES.get(job.state, ()):
                raise RuntimeError(f"job {job.id}: {job.state} -> {to} is not a legal move")
            now = time.monotonic()
            if job.state is RUNNING and job.started:
                self.service_s = 0.8 * self.service_s + 0.2 * (now - job.started)
            if to is ADMITTING:
                job.taken = now
            if to is RUNNING:
                job.started = now
            job.state, job.reason = to, reason if to is CANCELLED else None
            if to not in MOVES:
                del self.live[job]
            self.cond.notify_all()
        if self.metrics is not None:
            if to is CANCELLED:
                self.metrics.cancelled(reason or "shutdown")
            if result is not None:
                self.metrics.tokens(result.generated_tokens, result.prompt_tokens)

    def jobs(self, *states: JobState) -> list[Job]:
        """The live jobs in these states, oldest first."""
        with self.cond:
            return [j for j in self.live if j.state in states]

    def count(self, *states: JobState) -> int:
        with self.cond:
            return sum(j.state in states for j in self.live)

    def depth(self) -> int:
        """Jobs waiting for the engine."""
        return self.count(QUEUED)

    def in_engine(self) -> int:
        """Jobs the engine took and has not finished (admitting or in a slot)."""
        return self.count(*IN_ENGINE)

    def slots_busy(self) -> int:
        return self.count(RUNNING)

    def busy(self) -> int:
        """Accepted jobs not finished yet, in any state."""
        with self.cond:
            return len(self.live)

    # ------------------------------------------------------------------ handler side (event loop)
    def reserve(self) -> Ticket:
        with self.cond:
            if self.state == "draining":
                raise unavailable("shutting_down", "the server is shutting down", 5)
            if self.state != "ready":
                raise unavailable("not_ready", "the model is still loading or warming up", 2)
            if self.reserved + len(self.live) >= self.queue_size + self.slots:
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
            job.state = QUEUED
            self.live[job] = None
            self.cond.notify_all()

    def _release(self, ticket: Ticket) -> None:
        with self.cond:
            if not ticket.spent:
                ticket.spent = True
                self.reserved -= 1

    def retry_after_s(self) -> float:
        """Rough time until a place frees up: the work ahead divided over the slots."""
        ahead = len(self.live) + self.reserved
        return min(60.0, max(1.0, self.service_s * ahead / max(1, self.slots)))

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
        """The oldest queued job, moved to ADMITTING (the engine has it now)."""
        with self.cond:
            job = next((j for j in self.live if j.state is QUEUED), None)
            if job is not None:
                self.move(job, ADMITTING)
            return job

    def peek(self, n: int) -> list[Job]:
        """The first `n` queued jobs, left in the queue (the engine prepares them before their turn)."""
        return self.jobs(QUEUED)[:n]

    def wait_for_work(self, timeout: float) -> None:
        with self.cond:
            if not any(j.state is QUEUED for j in self.live):
                self.cond.wait(timeout)
