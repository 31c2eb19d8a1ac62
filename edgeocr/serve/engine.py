"""The engine thread: the only code that touches the model.

The worker drives edgeocr.batch.SlotScheduler (pages decoded `slots` at a time, the artifact's slot count):
it admits queued jobs while slots are free, runs one decode step for every live slot, routes each token to
its job, and cancels a job between two steps when its client has left or its deadline has passed.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import threading
import time
from pathlib import Path
from typing import Protocol

from edgeocr import __version__, prompts
from edgeocr.batch import PageRequest, SlotEvent, SlotScheduler
from edgeocr.decode import DecodeOptions
from edgeocr.errors import EdgeOCRError, ImageError, ImageTooLarge, PromptError
from edgeocr.serve.errors import HTTPError, unavailable
from edgeocr.serve.jobs import DONE, ERROR, TOKEN, Admission, Job

log = logging.getLogger("edgeocr.serve")


class Scheduler(Protocol):
    """What the worker drives: edgeocr.batch.SlotScheduler (pages decoded `slots` at a time)."""

    slots: int                                            # pages decoded at once

    def free(self) -> int: ...                            # slots free now

    def admit(self, request: PageRequest, tag) -> None: ...   # preprocess + vision + prefill into a free slot;
                                                          # raises EdgeOCRError subclasses on bad input

    def step(self) -> list[SlotEvent]: ...                # one decode step for every live slot

    def cancel(self, tag) -> object | None: ...           # frees the tag's slot now (finish_reason "cancelled")

    def live(self) -> int: ...                            # slots in use


def open_scheduler(cfg) -> tuple[Scheduler, dict]:
    """Load the artifact; returns the scheduler and what /v1/info reports about it."""
    from edgeocr.model import OCRModel

    model = OCRModel(cfg.artifact, device=cfg.device, threads=cfg.threads or None)
    m = model.artifact
    info = {"version": __version__, "backend": model.session.name, "precision": m.precision,
            "device": cfg.device, "artifact": str(cfg.artifact),
            "manifest_sha256": hashlib.sha256((Path(cfg.artifact) / "manifest.json").read_bytes()).hexdigest(),
            "source_sha256": m.source.get("sha256"), "cache_len": m.cache_len, "slots": m.slots,
            "max_new_tokens": cfg.max_new_tokens, "tasks": prompts.task_names()}
    return SlotScheduler(model, deltas=True), info


def warmup_request() -> PageRequest:
    import numpy as np

    img = np.full((256, 256, 3), 255, np.uint8)   # a white page with one dark bar: image [256, 256, 3] uint8
    img[100:140, 40:200] = 0
    return PageRequest(img, prompts.DEFAULT_TASK, None, "zh", DecodeOptions(max_new_tokens=2))


def admit_error(e: Exception) -> HTTPError:
    """The reply for a request the scheduler refused at admission."""
    if isinstance(e, ImageTooLarge):
        return HTTPError(413, "invalid_image", str(e))
    if isinstance(e, ImageError):
        return HTTPError(400, "invalid_image", str(e))
    if isinstance(e, (PromptError, EdgeOCRError)):
        return HTTPError(400, "invalid_request", str(e))
    return HTTPError(500, "internal_error", "the engine failed on this request; see the daemon log")


class EngineWorker(threading.Thread):
    """Loads the model, then admits, steps and cancels jobs until stopped."""

    def __init__(self, cfg, admission: Admission, notifier, metrics=None, opener=open_scheduler):
        super().__init__(name="edgeocr-engine", daemon=True)
        self.cfg, self.admission, self.notifier, self.metrics = cfg, admission, notifier, metrics
        self.opener = opener
        self.phase = "loading"               # loading | warming | ready | failed | stopped
        self.error: str | None = None        # why loading (or the loop) failed
        self.info: dict = {}
        self.sched: Scheduler | None = None
        self.running: dict[Job, float] = {}  # live jobs -> admit time (monotonic)
        self.admitting: Job | None = None    # the job inside scheduler.admit() now
        self._halt = threading.Event()
        self._cancel_all: str | None = None  # set by the daemon when the drain time is over
        self._reasons: dict[Job, str] = {}   # why a live job is being cancelled
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
        return not self.running and self.admitting is None and self.admission.depth() == 0

    def busy(self) -> int:
        """Accepted jobs not finished yet: queued, being admitted, or in a slot."""
        return len(self.running) + (self.admitting is not None) + self.admission.depth()

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
            self.sched = None       # the model is released here, on its own thread, with nothing running in it
            gc.collect()
        if self.phase != "failed":
            self.phase = "stopped"

    def _load(self) -> None:
        self.notifier.status(f"loading {self.cfg.artifact}")
        t0 = time.perf_counter()
        self.sched, self.info = self.opener(self.cfg)
        log.info("loaded %s (%s, %s, %d slot(s)) in %.1f s", self.cfg.artifact, self.info.get("precision"),
                 self.info.get("backend"), self.sched.slots, time.perf_counter() - t0)
        if self.cfg.warmup:
            self.phase = "warming"
            self.notifier.status("warming up")
            self._run_alone(warmup_request())
            log.info("warm-up done in %.1f s", time.perf_counter() - t0)
        self.phase = "ready"
        self.admission.open(self.sched.slots)
        self.notifier.status("ready")
        self.notifier.ready()

    def _run_alone(self, request: PageRequest):
        tag = object()
        self.sched.admit(request, tag)
        while True:
            for ev in self.sched.step():
                if ev.tag is tag and ev.result is not None:
                    return ev.result

    def _loop(self) -> None:
        while not self._halt.is_set():
            self._ping()
            if self._cancel_all:
                self._cancel_everything(self._cancel_all)
            self._reap()
            self._admit()
            if self.sched.live():
                self._step()
            else:
                self.admission.wait_for_work(self.tick)

    def _ping(self) -> None:
        now = time.monotonic()
        if now - self._pinged >= self.tick:
            self._pinged = now
            self.notifier.watchdog()

    # ------------------------------------------------------------------ jobs
    def _admit(self) -> None:
        while self.sched.free() and not self._halt.is_set():
            job = self.admission.take()
            if job is None:
                return
            if job.gone:
                self.admission.leave()
                log.info("%s client left before its turn: dropped", job.id)
                self._count_cancel("client_gone")
                continue
            now = time.monotonic()
            if now > job.deadline:
                self.admission.leave()
                job.post(ERROR, HTTPError(504, "deadline_exceeded",
                                          "the request waited past its deadline in the queue"))
                self._count_cancel("deadline")
                continue
            job.started = now
            self.admitting = job
            try:
                self.sched.admit(job.request, job)
            except Exception as e:
                self.admission.leave()
                err = admit_error(e)
                if err.status == 500:
                    log.exception("%s admission failed", job.id)
                job.post(ERROR, err)
                continue
            finally:
                self.admitting = None
            job.request = None          # the image bytes are not needed any more
            self.running[job] = now

    def _step(self) -> None:
        try:
            events = self.sched.step()
        except Exception:
            log.exception("decode step failed with %d page(s) live", len(self.running))
            self._fail_everything(HTTPError(500, "internal_error", "the decode step failed; see the daemon log"))
            return
        for ev in events:
            job = ev.tag
            if job not in self.running:          # finished or cancelled already: nothing more to send
                continue
            if job.stream and not job.gone and ev.token_id is not None:     # None: a blank page's result alone
                job.post(TOKEN, ev.token_id, ev.text_delta)
            if ev.result is not None:
                self._finish(job, ev.result)

    def _finish(self, job: Job, result) -> None:
        started = self.running.pop(job, None)
        if started is not None:
            self.admission.leave()
            self.admission.record_service(time.monotonic() - started)
        if self.metrics is not None:
            self.metrics.tokens(result.generated_tokens, result.prompt_tokens)
        reason = self._reasons.pop(job, None)
        if result.finish_reason == "cancelled" or reason:
            self._post_cancelled(job, reason or "deadline")
        elif not job.gone:
            job.post(DONE, result)

    def _reap(self) -> None:
        """Cancel live jobs whose client left or whose deadline passed: within one decode step."""
        now = time.monotonic()
        for job in list(self.running):
            if job.gone:
                self._cancel(job, "client_gone")
            elif now > job.deadline:
                self._cancel(job, "deadline")

    def _cancel(self, job: Job, reason: str) -> None:
        self._reasons[job] = reason
        try:
            result = self.sched.cancel(job)
        except Exception:
            log.exception("%s cancel failed", job.id)
            result = None
        if job in self.running:
            if result is None:
                self.running.pop(job, None)
                self.admission.leave()
                self._reasons.pop(job, None)
                self._post_cancelled(job, reason)
            else:
                self._finish(job, result)

    def _post_cancelled(self, job: Job, reason: str) -> None:
        self._count_cancel(reason)
        if reason == "client_gone" or job.gone:
            log.info("%s client left: generation stopped", job.id)
        elif reason == "deadline":
            job.post(ERROR, HTTPError(504, "deadline_exceeded",
                                      f"generation stopped at the {self.cfg.deadline_s:g} s deadline"))
        else:
            job.post(ERROR, unavailable("shutting_down", "the server shut down before this request finished", 5))

    def _cancel_everything(self, reason: str) -> None:
        self._cancel_all = None
        for job in self.admission.take_all():
            self._post_cancelled(job, reason)
        for job in list(self.running):
            self._cancel(job, reason)

    def _fail_everything(self, err: HTTPError) -> None:
        for job in list(self.running):
            try:
                self.sched.cancel(job)
            except Exception:
                pass
            if not job.gone:
                job.post(ERROR, err)
            self.admission.leave()
        self.running.clear()
        self._reasons.clear()

    def _count_cancel(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.cancelled(reason)
