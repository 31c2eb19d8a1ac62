"""The engine thread: the only code that touches the model.

The worker drives one edgeocr.slots.SlotScheduler (pages decoded `slots` at a time, the artifact's slot
count) through edgeocr.slots.drive: it takes queued jobs, has their images decoded and prepared on the
model's worker pool (never on this thread), admits prepared pages while slots are free, routes each step's
tokens to their jobs, and cancels a job between two steps when its client has left or its deadline has passed.
Each of those is a move of the job's state (edgeocr.serve.jobs.Admission.move); the worker keeps no counts.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import threading
import time
from concurrent.futures import wait as wait_futures
from pathlib import Path

from edgeocr import __version__, prompts
from edgeocr.decode import DecodeOptions, FinishReason
from edgeocr.errors import EdgeOCRError, ImageError, ImageTooLarge, PromptError
from edgeocr.serve.errors import HTTPError, unavailable
from edgeocr.serve.jobs import (ADMITTING, CANCELLED, DONE, ERROR, FAILED, IN_ENGINE, QUEUED, RUNNING, TOKEN,
                                Admission, Job, JobState)
from edgeocr.slots import PageRequest, SlotEvent, drive

log = logging.getLogger("edgeocr.serve")

__all__ = ["EngineWorker", "PageRequest", "open_model"]


def open_model(cfg):
    """Load the artifact; returns the loaded model (edgeocr.model.OCRModel) and what /v1/info reports about it."""
    from edgeocr.model import OCRModel

    model = OCRModel(cfg.artifact, device=cfg.device, threads=cfg.threads or None, max_pixels=cfg.max_pixels,
                     vision_ahead=cfg.vision_ahead)
    m = model.artifact
    info = {"version": __version__, "backend": model.session.name, "precision": m.precision,
            "device": cfg.device, "artifact": str(cfg.artifact),
            "manifest_sha256": hashlib.sha256((Path(cfg.artifact) / "manifest.json").read_bytes()).hexdigest(),
            "source_sha256": m.source.get("sha256"), "cache_len": m.cache_len, "slots": m.slots,
            "max_new_tokens": cfg.max_new_tokens, "tasks": prompts.task_names()}
    return model, info


def warmup_request() -> PageRequest:
    import numpy as np

    img = np.full((256, 256, 3), 255, np.uint8)   # a white page with one dark bar: image [256, 256, 3] uint8
    img[100:140, 40:200] = 0
    return PageRequest(img, prompts.DEFAULT_TASK, None, "zh", DecodeOptions(max_new_tokens=2))


def admit_error(e: Exception) -> HTTPError:
    """The reply for a request refused while it was prepared or admitted."""
    if isinstance(e, ImageTooLarge):
        return HTTPError(413, "invalid_image", str(e))
    if isinstance(e, ImageError):
        return HTTPError(400, "invalid_image", str(e))
    if isinstance(e, (PromptError, EdgeOCRError)):
        return HTTPError(400, "invalid_request", str(e))
    return HTTPError(500, "internal_error", "the engine failed on this request; see the daemon log")


class EngineWorker(threading.Thread):
    """Loads the model, then prepares, admits, steps and cancels jobs until stopped."""

    def __init__(self, cfg, admission: Admission, notifier, opener=open_model):
        super().__init__(name="edgeocr-engine", daemon=True)
        self.cfg, self.admission, self.notifier = cfg, admission, notifier
        self.opener = opener
        self.phase = "loading"               # loading | warming | ready | failed | stopped
        self.error: str | None = None        # why loading (or the loop) failed
        self.info: dict = {}
        self.model = None                    # edgeocr.model.OCRModel once loaded
        self.sched = None                    # its edgeocr.slots.SlotScheduler
        self._halt = threading.Event()
        self._cancel_all: str | None = None  # set by the daemon when the drain time is over
        wd = notifier.watchdog_usec / 1e6
        self.tick = min(1.0, wd / 4) if wd else 1.0
        self._pinged = 0.0

    # ------------------------------------------------------------------ control (other threads)
    def stop(self) -> None:
        self._halt.set()
        self.admission.wake()

    def cancel_all(self, reason: str = "shutdown") -> None:
        self._cancel_all = reason
        self.admission.wake()

    def idle(self) -> bool:
        return self.busy() == 0

    def busy(self) -> int:
        """Accepted jobs not finished yet: queued (being prepared, maybe), being admitted, or in a slot."""
        return self.admission.busy()

    # ------------------------------------------------------------------ thread
    def run(self) -> None:
        try:
            self._load()
        except Exception as e:  # a failed load is reported and ends the daemon, never hangs the unit
            self.error = f"{type(e).__name__}: {e}"
            log.error("cannot load %s: %s", self.cfg.artifact, self.error)
            self.notifier.status(f"failed to load: {self.error}")
            self.phase = "failed"
            return
        try:
            self._loop()
            self._cancel_everything("shutdown")     # nothing accepted is left without a reply
        except Exception as e:
            log.exception("engine loop failed")
            self.error = f"{type(e).__name__}: {e}"
            self.phase = "failed"
            self._fail_everything(HTTPError(500, "internal_error", "the engine stopped; see the daemon log"))
        finally:
            self.model.workers.close()
            self.sched = self.model = None  # released here, on its own thread, with nothing running in it
            gc.collect()
        if self.phase != "failed":
            self.phase = "stopped"

    def _load(self) -> None:
        self.notifier.status(f"loading {self.cfg.artifact}")
        t0 = time.perf_counter()
        self.model, self.info = self.opener(self.cfg)
        self.sched = self.model.scheduler(deltas=True, vision_ahead=self.cfg.vision_ahead)
        if self.cfg.warmup:
            self.phase = "warming"
            self.notifier.status("warming up")
            self._run_alone(warmup_request())
            log.info("warm-up done in %.1f s", time.perf_counter() - t0)
        self.admission.open(self.sched.slots)
        self.notifier.status("ready")
        self.notifier.ready()
        self.phase = "ready"                 # last: once readiness answers 200, systemd has been told READY=1

    def _prepare(self, r: PageRequest):
        """A Future of the request's prepared Page, made on the model's worker pool."""
        return self.model.workers.submit(self.model.page, r.image, r.task, r.prompt, r.lang, r.options)

    def _run_alone(self, request: PageRequest):
        tag = object()
        page = self._prepare(request).result()
        for events in drive(self.sched, [(tag, page)]):
            for ev in events:
                if ev.tag is tag and ev.result is not None:
                    return ev.result

    def _loop(self) -> None:
        while not self._halt.is_set():
            try:
                for events in drive(self.sched, self._feed(), self._admit_failed):
                    self._route(events)
                    if self._halt.is_set():
                        return
                    self._ping()
                    if self._cancel_all:
                        self._cancel_everything(self._cancel_all)
                    self._reap()
                    self._prepare_ahead()              # the next pages are prepared while these decode
            except Exception:
                log.exception("decode step failed with %d page(s) live", self.admission.slots_busy())
                self._fail_everything(HTTPError(500, "internal_error", "the decode step failed; see the daemon log"))

    def _ping(self) -> None:
        now = time.monotonic()
        if now - self._pinged >= self.tick:
            self._pinged = now
            self.notifier.watchdog()

    # ------------------------------------------------------------------ jobs
    def _feed(self):
        """What drive() admits: (job, Page) for the oldest waiting job once it is prepared, or None when it is
        not (waiting up to a tick first when no slot is live).  Ends when the worker is halted."""
        while not self._halt.is_set():
            self._prepare_ahead()
            head = next(iter(self.admission.peek(1)), None)
            if head is not None and (head.gone or time.monotonic() > head.deadline or head.prepared.done()):
                job = self.admission.take()            # the head, now ADMITTING: only this thread takes
                page = None if self._dropped(job) else self._prepared(job)
                if page is not None:
                    yield job, page                    # RUNNING at the next _route unless _admit_failed
                continue
            if self.sched.idle():
                if head is not None:
                    wait_futures([head.prepared], timeout=self.tick)
                else:
                    self.admission.wait_for_work(self.tick)
            yield None

    def _prepare_ahead(self) -> None:
        """The next `slots` waiting jobs are prepared on the worker pool while they wait (decoded, letterboxed,
        tokenized: never on this thread)."""
        for job in self.admission.peek(self.sched.slots):
            if job.prepared is None and not job.gone:
                job.prepared = self._prepare(job.request)

    def _dropped(self, job: Job) -> bool:
        """A job taken from the queue whose client left or whose deadline passed: answered, True."""
        if job.gone:
            self._forget(job)
            self.admission.move(job, CANCELLED, "client_gone")
            log.info("%s client left before its turn: dropped", job.id)
            return True
        if time.monotonic() > job.deadline:
            self._forget(job)
            self.admission.move(job, CANCELLED, "deadline")
            job.post(ERROR, HTTPError(504, "deadline_exceeded", "the request waited past its deadline in the queue"))
            return True
        return False

    @staticmethod
    def _forget(job: Job) -> None:
        if job.prepared is not None:
            job.prepared.cancel()
        job.prepared = job.request = None

    def _prepared(self, job: Job):
        """The job's Page, or None when it failed to prepare (answered)."""
        try:
            page = job.prepared.result()
        except Exception as e:
            self._admit_failed(job, e)
            return None
        self._forget(job)                   # the image bytes are not needed any more
        return page

    def _admit_failed(self, job: Job, e: Exception) -> None:
        self._forget(job)
        self.admission.move(job, FAILED)
        err = admit_error(e)
        if err.status == 500:
            log.error("%s preparation or admission failed", job.id, exc_info=e)
        job.post(ERROR, err)

    def _route(self, events: list[SlotEvent]) -> None:
        for job in self.admission.jobs(ADMITTING):     # admitted since the last step: each holds a slot now
            self.admission.move(job, RUNNING)
        for ev in events:
            job = ev.tag
            if job.state is not RUNNING:         # finished or cancelled already: nothing more to send
                continue
            if job.stream and not job.gone and ev.token_id is not None:     # None: a blank page's result alone
                job.post(TOKEN, ev.token_id, ev.text_delta)
            if ev.result is not None:
                self._finish(job, ev.result)

    def _finish(self, job: Job, result) -> None:
        if result.finish_reason == FinishReason.CANCELLED:     # the scheduler stopped it: not this worker
            self.admission.move(job, CANCELLED, "deadline", result)
            self._post_cancelled(job, "deadline")
            return
        self.admission.move(job, JobState.DONE, result=result)
        if not job.gone:
            job.post(DONE, result)

    def _reap(self) -> None:
        """Cancel jobs whose client left or whose deadline passed, running or still queued: within one decode
        step (drive() reads the queue only while a slot is free, so a queued job would otherwise hold its
        place, and count against the queue's limit, until one frees)."""
        now = time.monotonic()
        for job in self.admission.jobs(RUNNING):
            if job.gone:
                self._cancel(job, "client_gone")
            elif now > job.deadline:
                self._cancel(job, "deadline")
        for job in self.admission.jobs(QUEUED):
            if job.gone or now > job.deadline:
                self._dropped(job)

    def _cancel(self, job: Job, reason: str) -> None:
        """Stop a job the engine holds (admitting or in a slot) and answer it."""
        try:
            result = self.sched.cancel(job)
        except Exception:
            log.exception("%s cancel failed", job.id)
            result = None
        self.admission.move(job, CANCELLED, reason, result)
        self._post_cancelled(job, reason)

    def _post_cancelled(self, job: Job, reason: str) -> None:
        if reason == "client_gone" or job.gone:
            log.info("%s client left: generation stopped", job.id)
        elif reason == "deadline":
            job.post(ERROR, HTTPError(504, "deadline_exceeded",
                                      f"generation stopped at the {self.cfg.deadline_s:g} s deadline"))
        else:
            job.post(ERROR, unavailable("shutting_down", "the server shut down before this request finished", 5))

    def _cancel_everything(self, reason: str) -> None:
        self._cancel_all = None
        for job in self.admission.jobs(QUEUED):
            self._forget(job)
            self.admission.move(job, CANCELLED, reason)
            self._post_cancelled(job, reason)
        for job in self.admission.jobs(*IN_ENGINE):
            self._cancel(job, reason)

    def _fail_everything(self, err: HTTPError) -> None:
        """The engine failed under the jobs it holds: each is answered with `err`."""
        for job in self.admission.jobs(*IN_ENGINE):
            try:
                self.sched.cancel(job)
            except Exception:
                pass
            self._forget(job)
            self.admission.move(job, FAILED)
            if not job.gone:
                job.post(ERROR, err)
