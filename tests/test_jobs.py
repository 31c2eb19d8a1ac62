"""The daemon's jobs as states (edgeocr.serve.jobs): queued -> admitting -> running -> done | cancelled | failed,
moved by Admission.move only; the counts the daemon reports are derived from the states."""

from __future__ import annotations

import asyncio
import collections
import time

import pytest

from conftest import make_image
from edgeocr.decode import DecodeOptions

LONG = DecodeOptions(max_new_tokens=400, ignore_stop=True, tail_repetition_stop=False)
SHORT = DecodeOptions(max_new_tokens=3)


class _Metrics:
    """What Admission.move reports: cancels by reason, tokens."""

    def __init__(self):
        self.reasons: collections.Counter = collections.Counter()
        self.generated = 0

    def cancelled(self, reason: str) -> None:
        self.reasons[reason] += 1

    def tokens(self, generated: int, prompt: int) -> None:
        self.generated += generated


def _job(jid, image, options, loop, deadline_s=60.0):
    from edgeocr.serve.jobs import Job
    from edgeocr.slots import PageRequest
    return Job(id=jid, request=PageRequest(image, options=options), stream=False,
               deadline=time.monotonic() + deadline_s, loop=loop)


def test_moves_are_checked_and_counts_follow_states():
    from edgeocr.serve.jobs import ADMITTING, CANCELLED, QUEUED, RUNNING, Admission, Job, JobState

    adm = Admission(queue_size=2, slots=1, metrics=(m := _Metrics()))
    adm.open(1)
    loop = asyncio.new_event_loop()
    try:
        a, b = (Job(id=i, request=None, stream=False, deadline=0.0, loop=loop) for i in "ab")
        adm.submit(adm.reserve(), a)
        adm.submit(adm.reserve(), b)
        assert (adm.depth(), adm.in_engine(), adm.slots_busy(), adm.busy()) == (2, 0, 0, 2)
        assert adm.take() is a and a.state is ADMITTING and b.state is QUEUED
        with pytest.raises(RuntimeError, match="admitting -> done is not a legal move"):
            adm.move(a, JobState.DONE)
        adm.move(a, RUNNING)
        assert (adm.depth(), adm.in_engine(), adm.slots_busy(), adm.busy()) == (1, 1, 1, 2)
        adm.move(b, CANCELLED, "client_gone")
        adm.move(a, JobState.DONE)
        assert (adm.depth(), adm.in_engine(), adm.slots_busy(), adm.busy()) == (0, 0, 0, 0)
        assert a.started > 0 and b.reason == "client_gone" and m.reasons == {"client_gone": 1}
        with pytest.raises(RuntimeError, match="done -> running"):     # finished is final
            adm.move(a, RUNNING)
    finally:
        loop.close()


def test_every_exit_path_ends_in_its_state_and_the_counts_return_to_zero(art_a):
    """One engine over the tiny artifact (1 slot), each way a job can end: done; a bad image (failed while
    prepared); an admission error; client gone and deadline, both while running and while queued behind a busy
    slot (dropped while the slot is still busy); a failed
    decode step; shutdown of a running and a queued job.  Each job ends in its state with its reply, the cancel
    metrics count each reason, and every count (queued, in the engine, slots busy, accepted, reserved) is 0."""
    from edgeocr.sdnotify import Notifier
    from edgeocr.serve.config import ServerConfig
    from edgeocr.serve.engine import EngineWorker, open_model
    from edgeocr.serve.jobs import DONE, ERROR, RUNNING, Admission, JobState

    inject = {"step": False}

    def opener(cfg):
        model, info = open_model(cfg)
        make = model.scheduler

        def scheduler(**kw):
            sched = make(**kw)
            admit, step = sched.admit, sched.step

            def admit_(page, tag):
                if tag.id == "admit-fails":
                    raise RuntimeError("injected admission failure")
                return admit(page, tag)

            def step_():
                if inject["step"]:
                    inject["step"] = False
                    raise RuntimeError("injected step failure")
                return step()

            sched.admit, sched.step = admit_, step_
            return sched

        model.scheduler = scheduler
        return model, info

    metrics = _Metrics()
    adm = Admission(queue_size=8, metrics=metrics)
    worker = EngineWorker(ServerConfig(artifact=str(art_a), threads=1, warmup=False), adm, Notifier(""),
                          opener=opener)
    worker.start()
    img = make_image(1)
    jobs = {}

    async def until(pred, what, timeout=60.0):
        end = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < end, what
            await asyncio.sleep(0.005)

    async def main():
        loop = asyncio.get_running_loop()
        await until(lambda: worker.phase == "ready", "engine ready")

        def submit(jid, image=img, options=SHORT, deadline_s=60.0):
            jobs[jid] = job = _job(jid, image, options, loop, deadline_s)
            adm.submit(adm.reserve(), job)
            return job

        async def reply(job):
            return await asyncio.wait_for(job.events.get(), 60)

        async def running(job):
            await until(lambda: job.state is RUNNING, f"{job.id} running")

        async def ended(job):
            await until(lambda: job.state not in (JobState.QUEUED, JobState.ADMITTING, RUNNING), f"{job.id} ended")

        out = {}
        out["done"] = await reply(submit("done"))
        out["bad-image"] = await reply(submit("bad-image", b"not an image"))
        out["admit-fails"] = await reply(submit("admit-fails"))
        # gone / deadline while running
        job = submit("gone-running", options=LONG)
        await running(job)
        job.gone = True
        adm.wake()
        await ended(job)
        job = submit("deadline-running", options=LONG)
        await running(job)
        job.deadline = time.monotonic() - 1
        out["deadline-running"] = await reply(job)
        # gone / deadline while queued, behind a running job
        blocker = submit("blocker", options=LONG)
        await running(blocker)
        submit("gone-queued").gone = True
        submit("deadline-queued", deadline_s=-1.0)
        assert adm.depth() == 2 and adm.in_engine() == 1 and adm.slots_busy() == 1 and worker.busy() == 3
        adm.wake()
        # dropped within a decode step while every slot is still busy, not when one frees
        out["deadline-queued"] = await reply(jobs["deadline-queued"])
        await ended(jobs["gone-queued"])
        assert blocker.state is RUNNING and adm.depth() == 0, "queued jobs dropped only once the slot freed"
        blocker.gone = True
        adm.wake()
        await ended(blocker)
        # the decode step fails under a running job
        job = submit("step-fails", options=LONG)
        await running(job)
        inject["step"] = True
        out["step-fails"] = await reply(job)
        # shutdown: one running, one queued behind it
        job = submit("shutdown-running", options=LONG)
        await running(job)
        submit("shutdown-queued")
        worker.cancel_all("shutdown")
        out["shutdown-running"] = await reply(job)
        out["shutdown-queued"] = await reply(jobs["shutdown-queued"])
        await until(worker.idle, "idle")
        return out

    try:
        out = asyncio.run(main())
    finally:
        worker.stop()
        worker.join(30)
    assert worker.phase == "stopped"
    kinds = {k: (v[0], getattr(v[1], "status", None)) for k, v in out.items()}
    assert kinds == {"done": (DONE, None), "bad-image": (ERROR, 400), "admit-fails": (ERROR, 500),
                     "deadline-running": (ERROR, 504), "deadline-queued": (ERROR, 504), "step-fails": (ERROR, 500),
                     "shutdown-running": (ERROR, 503), "shutdown-queued": (ERROR, 503)}
    states = {k: (j.state.value, j.reason) for k, j in jobs.items()}
    assert states == {"done": ("done", None), "bad-image": ("failed", None), "admit-fails": ("failed", None),
                      "gone-running": ("cancelled", "client_gone"), "deadline-running": ("cancelled", "deadline"),
                      "blocker": ("cancelled", "client_gone"), "gone-queued": ("cancelled", "client_gone"),
                      "deadline-queued": ("cancelled", "deadline"), "step-fails": ("failed", None),
                      "shutdown-running": ("cancelled", "shutdown"), "shutdown-queued": ("cancelled", "shutdown")}
    assert metrics.reasons == {"client_gone": 3, "deadline": 2, "shutdown": 2}
    assert metrics.generated >= 3 + 3 * 1        # the done page's 3, and each cancelled running page's tokens
    assert (adm.depth(), adm.in_engine(), adm.slots_busy(), adm.busy(), adm.reserved) == (0, 0, 0, 0, 0)
    assert worker.idle() and not adm.live
    done = jobs["done"]            # the queue wait a log line reports ends when the engine takes the job
    assert done.enqueued < done.taken <= done.started


def test_systemd_is_told_ready_before_readiness_answers_200(art_a):
    """READY=1 goes out while the engine's phase is not yet "ready" (which /health/ready reports as 200): a
    client that sees 200 can rely on systemd having been told, and systemd's READY=1 means admission is open."""
    from edgeocr.sdnotify import Notifier
    from edgeocr.serve.config import ServerConfig
    from edgeocr.serve.engine import EngineWorker
    from edgeocr.serve.jobs import Admission

    class Watching(Notifier):
        seen: tuple | None = None

        def ready(self):
            self.seen = (worker.phase, worker.admission.state)
            super().ready()

    notifier = Watching("")
    worker = EngineWorker(ServerConfig(artifact=str(art_a), threads=1, warmup=False), Admission(queue_size=2),
                          notifier)
    worker.start()
    try:
        end = time.monotonic() + 60
        while worker.phase != "ready":
            assert worker.phase == "loading" and time.monotonic() < end, worker.error
            time.sleep(0.01)
        assert notifier.seen == ("loading", "ready")          # engine not "ready" yet; admission already open
    finally:
        worker.stop()
        worker.join(30)
