"""`edgeocr run --ray`: a private Ray on this machine with 2 CPU actors reads the demo model's pages (images, a
PDF, an unreadable file) to the same texts as the local run; resume; Parquet; an actor killed mid-run; no Ray
process left behind.  Every Ray process a test starts is recorded while it runs and ended by id afterwards."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgeocr import batchrun, distributed, pages, parquet_out
from edgeocr.decode import DecodeOptions

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "calibration_data" / "eval"
TOKENS = "16"                         # --max-new-tokens: the texts differ page to page well before this
COMMON = ["--max-new-tokens", TOKENS, "--threads", "1", "--task", "structured_parse"]


# ---------------------------------------------------------------------------------------------- processes
def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time in ticks) or None when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0], int(fields[19])


def _cpu_ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])           # utime + stime


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class ProcessWatch:
    """Runs commands and records every descendant while they run (pid and start time, so a reused pid is never
    taken for one of ours); `leftovers` are those still running, `end_leftovers` kills them by pid."""

    def __init__(self):
        self.seen: dict[int, tuple[int, str]] = {}      # pid -> (start ticks, command line)

    def _scan(self, root: int) -> None:
        children: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if d.isdigit() and (st := _stat(int(d))) is not None:
                children.setdefault(st[0], []).append(int(d))
        todo = [root]
        while todo:
            for c in children.get(todo.pop(), []):
                st = _stat(c)
                if st is not None and (c not in self.seen or self.seen[c][0] == st[2]):
                    self.seen[c] = (st[2], _cmdline(c) or self.seen.get(c, (0, ""))[1])   # a worker renames itself
                todo.append(c)

    def run(self, args: list, cwd: Path, timeout: float = 240, on_poll=None) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            p = subprocess.Popen([sys.executable, "-m", "edgeocr", "run", *map(str, args)], cwd=cwd, env=env,
                                 stdout=out, stderr=err, stdin=subprocess.DEVNULL)
            t0 = time.monotonic()
            try:
                while p.poll() is None:
                    self._scan(p.pid)
                    if on_poll is not None:
                        on_poll(self)
                    if time.monotonic() - t0 > timeout:
                        raise AssertionError(f"edgeocr run {args} still running after {timeout} s")
                    time.sleep(0.2)
            finally:
                if p.poll() is None:
                    p.kill()
                p.wait()
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(p.args, p.returncode, out.read(), err.read())

    def pids(self, marker: str) -> set[int]:
        return {pid for pid, (_, cmd) in self.seen.items() if marker in cmd}

    def leftovers(self) -> list[tuple[int, str]]:
        out = []
        for pid, (start, cmd) in self.seen.items():
            st = _stat(pid)
            if st is not None and st[2] == start and st[1] != "Z":
                out.append((pid, cmd))
        return out

    def end_leftovers(self) -> None:
        for pid, _ in self.leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def assert_none_left(self, grace_s: float = 15) -> None:
        t0 = time.monotonic()
        while self.leftovers() and time.monotonic() - t0 < grace_s:
            time.sleep(0.3)
        assert not self.leftovers(), f"processes left running: {self.leftovers()}"


@pytest.fixture(scope="module")
def watch():
    w = ProcessWatch()
    tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")     # Ray's sockets live here: the path must stay short
    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp
    try:
        yield w
    finally:
        w.end_leftovers()                                # also when a test failed half-way
        if old is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- inputs
@pytest.fixture(scope="module")
def demo_art(tmp_path_factory):
    """The demo model with 2 slots: each actor call decodes two pages at once."""
    from quantize.export import ExportOptions, export
    out = tmp_path_factory.mktemp("demo") / "fp32-2slots"
    export(ROOT / "demo_model", out, ExportOptions(cache_len=1536, prefill_len=1280, slots=2))
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """in/: 8 held-out pages, a 3-page PDF and an unreadable file = 12 pages."""
    root = tmp_path_factory.mktemp("ray")
    d = root / "in"
    d.mkdir()
    for i in range(8):
        shutil.copy(EVAL / f"{i:06d}.jpg", d / f"{i:06d}.jpg")
    ims = [Image.open(EVAL / f"{i:06d}.jpg").convert("RGB") for i in (10, 11, 12)]
    ims[0].save(d / "scan.pdf", "PDF", save_all=True, append_images=ims[1:], resolution=150.0)
    (d / "broken.png").write_bytes(b"not an image")
    return root


def lines_of(path: Path) -> list[dict]:
    data = path.read_text(encoding="utf-8")
    assert data.endswith("\n")
    return [json.loads(s) for s in data.splitlines()]


def comparable(rec: dict) -> tuple:
    """What must agree between a local and a distributed run of a page (timings differ)."""
    if "error" in rec:
        return rec["file"], rec["page"], rec["error"]["type"], rec["error"]["message"]
    return (rec["file"], rec["page"], rec["text"], rec["finish_reason"], rec["generated_tokens"],
            tuple(rec["image_size"]), rec["task"])


def by_key(recs: list[dict]) -> dict:
    keys = [(r["file"], r["page"]) for r in recs]
    assert len(keys) == len(set(keys)), f"a page written twice: {sorted(keys)}"
    return {k: comparable(r) for k, r in zip(keys, recs)}


@pytest.fixture(scope="module")
def local_run(work, demo_art):
    """The reference: the same pages through `edgeocr run` without Ray (relative paths, as a user types them)."""
    out = work / "local.jsonl"
    p = subprocess.run([sys.executable, "-m", "edgeocr", "run", "in", "--model", demo_art, "--out", out, *COMMON],
                       cwd=work, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert p.returncode == 1, p.stderr                  # 1: the unreadable file
    recs = lines_of(out)
    assert len(recs) == 12 and sum("error" in r for r in recs) == 1
    return by_key(recs)


@pytest.fixture(scope="module")
def ray_run(work, demo_art, watch, local_run):
    out = work / "ray.jsonl"
    p = watch.run(["in", "--model", demo_art, "--out", out, "--ray", "local", "--ray-actors", "2", *COMMON],
                  cwd=work)
    return p, out


# ---------------------------------------------------------------------------------------------- end to end
def test_two_cpu_actors_read_the_pages_as_the_local_run(ray_run, local_run, watch):
    p, out = ray_run
    assert p.returncode == 1, p.stderr                  # as locally: a page failed
    recs = lines_of(out)
    assert by_key(recs) == local_run                    # every page once; same texts, same error rows
    bad = [r for r in recs if "error" in r]
    assert bad == [{"file": "in/broken.png", "page": None,
                    "error": {"type": "ImageError", "message": "in/broken.png: not a recognized image format"}}]
    ok = [r for r in recs if "error" not in r]
    assert all(set(r["timings_ms"]) >= {"load", "vision", "prefill", "decode", "total"} for r in ok)
    assert {r["page"] for r in ok if r["file"] == "in/scan.pdf"} == {1, 2, 3}
    assert "12 pages in" in p.stderr and "11 ok, 1 failed" in p.stderr
    assert "2 cpu actor(s) on Ray, 4 pages per call); first page after " in p.stderr   # 2 slots x 2 pages a call
    assert re.search(r"first page after [\d.]+ s \(actors' start and model load included\), then [\d.]+ pages/s",
                     p.stderr), p.stderr
    assert "error: in/broken.png: not a recognized image format" in p.stderr
    assert len(watch.pids("PageActor")) == 2, watch.seen                 # the pool: two actors, each loaded once
    watch.assert_none_left()


def test_resume_a_parquet_file_and_the_journal_of_a_killed_run(ray_run, local_run, work, demo_art, watch):
    """pages.parquet holds 5 pages and an error row; its journal one more page and a half-written line.  --resume
    runs the 6 others (the failed one again) and folds everything into one table: the local run's rows."""
    recs = lines_of(ray_run[1])
    good = [r for r in recs if "error" not in r]
    out = work / "pages.parquet"
    with parquet_out.ParquetOut(out) as w:
        for r in good[:5]:
            w.write(r)
        w.write({"file": good[6]["file"], "page": good[6]["page"], "error": {"type": "X", "message": "y"}})
    with open(parquet_out.journal_path(out), "w", encoding="utf-8") as j:
        j.write(json.dumps(good[5], ensure_ascii=False) + "\n" + '{"file": "in/scan.pdf", "pa')
    p = watch.run(["in", "--model", demo_art, "--out", out, "--resume", "--ray", "local", "--ray-actors", "2",
                   "--ray-call-pages", "1", *COMMON], cwd=work)
    assert p.returncode == 1, p.stderr
    assert "2 cpu actor(s) on Ray, 1 pages per call" in p.stderr
    assert "6 pages already done, 6 to go (1 error line(s) removed; 1 of those pages run again)" in p.stderr
    assert "6 pages in" in p.stderr
    assert not parquet_out.journal_path(out).exists()
    after = parquet_out.read_records(out)
    assert after[:6] == good[:6] and by_key(after) == local_run
    watch.assert_none_left()
    again = watch.run(["in/scan.pdf", "--model", demo_art, "--out", out, "--resume", "--ray", "local", *COMMON],
                      cwd=work)                          # (the unreadable file's error row would be tried again)
    assert again.returncode == 0 and "nothing to do: all 3 pages are in" in again.stderr, again.stderr


def test_an_actor_killed_mid_run_loses_and_repeats_no_page(work, demo_art, watch, local_run):
    out = work / "killed.jsonl"
    killed: list[int] = []
    cpu: dict[int, list[int]] = {}                       # actor pid -> CPU ticks at each poll

    def kill_one(w: ProcessWatch) -> None:
        actors = sorted(pid for pid, cmd in w.leftovers() if "PageActor" in cmd)
        for pid in actors:
            cpu.setdefault(pid, []).append(_cpu_ticks(pid))
        if not killed and actors and out.exists() and out.stat().st_size > 0:   # a call done, the others running
            work_s = {pid: cpu[pid][-1] - cpu[pid][max(0, len(cpu[pid]) - 5)] for pid in actors}   # last ~1 s
            busy = max(actors, key=work_s.get)
            if work_s[busy] > 0:                         # reading pages: killed in the middle of a call
                os.kill(busy, signal.SIGKILL)
                killed.append(busy)

    p = watch.run(["in", "--model", demo_art, "--out", out, "--ray", "local", "--ray-actors", "2", *COMMON],
                  cwd=work, on_poll=kill_one)
    assert killed, f"no actor was killed: the run ended first\n{p.stderr}"
    assert p.returncode == 1, p.stderr
    assert by_key(lines_of(out)) == local_run            # every page exactly once, as locally
    assert len(watch.pids("PageActor") - set(killed)) >= 2, "the dead actor was not replaced"
    watch.assert_none_left()


# ---------------------------------------------------------------------------------------------- the extra
def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")))


def test_a_local_run_does_not_import_ray(work, demo_art):
    p = _python("import sys; from edgeocr.cli import main; "
                f"rc = main(['run', 'in/000000.jpg', '--model', {str(demo_art)!r}, '--max-new-tokens', '2']); "
                "print('ray' in sys.modules, rc)", work)
    assert p.stdout.strip().splitlines()[-1] == "False 0", p.stdout + p.stderr


def test_without_ray_the_error_names_the_extra(work, demo_art):
    p = _python("import sys; sys.modules['ray'] = None; from edgeocr.cli import main; "
                f"sys.exit(main(['run', 'in', '--model', {str(demo_art)!r}, '--ray', '--out', 'x.jsonl']))", work)
    assert p.returncode == 1 and "--ray needs Ray Data: pip install 'edgeocr[ray]'" in p.stderr, p.stderr


@pytest.mark.parametrize("extra, message", [
    ([], "--ray writes its pages to a file: pass --out FILE.jsonl or FILE.parquet"),
    (["--out", "o.jsonl", "--remote", "unix:/nowhere.sock"], "--ray and --remote exclude each other"),
    (["--out", "o.jsonl", "--ray-actors", "0"], "--ray-actors must be a positive integer, got 0"),
    (["--out", "o.jsonl", "--ray-call-pages", "0"], "--ray-call-pages must be a positive integer, got 0"),
])
def test_usage_errors(work, demo_art, extra, message):
    p = _python(f"import sys; from edgeocr.cli import main; sys.exit(main(['run', 'in', '--model', "
                f"{str(demo_art)!r}, '--ray', 'local', *{extra!r}]))", work)
    assert p.returncode == 2 and message in p.stderr, p.stderr


# ---------------------------------------------------------------------------------------------- pieces
def test_pool_plan():
    gpu = distributed.plan_pool({"CPU": 64, "GPU": 8}, None, None, "exact", "cpu", slots=4, pages=1000)
    assert (gpu.actors, gpu.device, gpu.gpus, gpu.cpus, gpu.batch_pages) == (8, "cuda", 1.0, 1.0, 8)
    assert gpu.preprocess == "device"                    # the CUDA default when --device was left at cpu
    cpu = distributed.plan_pool({"CPU": 16}, None, 2, "exact", "cpu", slots=1, pages=1000)
    assert (cpu.actors, cpu.device, cpu.gpus, cpu.cpus, cpu.threads, cpu.batch_pages) == (7, "cpu", 0.0, 2.0, 2, 2)
    few = distributed.plan_pool({"CPU": 2}, 2, None, "exact", "cpu", slots=4, pages=3)
    assert (few.actors, few.batch_pages) == (2, 2)        # both actors get a call
    big = distributed.plan_pool({"CPU": 64, "GPU": 1}, None, None, "exact", "cuda", slots=8, pages=1000,
                                call_pages=64)
    assert (big.actors, big.batch_pages) == (1, 64)      # --ray-call-pages: 8 per slot instead of 2
    assert distributed.plan_pool({"CPU": 64, "GPU": 2}, None, None, "exact", "cuda", slots=8, pages=100,
                                 call_pages=64).batch_pages == 50      # never so many that an actor idles
    with pytest.raises(distributed.RayError, match="--ray-call-pages must be a positive integer, got 0"):
        distributed.plan_pool({"CPU": 4}, None, None, "exact", "cpu", slots=1, pages=10, call_pages=0)
    # --ray local: the actors' CPUs plus one for the read tasks, whatever the machine has
    assert distributed.local_cpus(2, 1) >= 2 * 1 + distributed.READ_CPUS
    assert distributed.local_cpus(3, 2) >= 3 * 2 + distributed.READ_CPUS
    assert distributed.local_cpus(None, None) == os.cpu_count()


# ---------------------------------------------------------------------------------------------- the actor
ACTOR_TOKENS = 8                       # every page of these tests runs to this many tokens (finish "length")


@pytest.fixture(scope="module")
def actor(demo_art, work):
    """One PageActor (2 slots) outside Ray, called directly as Ray calls it."""
    job = distributed.Job(model=str(demo_art), cwd=str(work), dpi=200, max_pixels=10**8, task="structured_parse",
                          prompt=None, lang="zh", options=DecodeOptions(max_new_tokens=ACTOR_TOKENS),
                          cuda_graph=None)
    a = distributed.PageActor(job, distributed.Pool(1, "cpu", 1.0, 0.0, 1, "exact", 4))
    yield a
    a.engine.close()


def _crop(i: int) -> np.ndarray:
    """Held-out page i cut to a height of its own (600 + i rows): its letterbox names it in the scheduler."""
    return np.ascontiguousarray(np.asarray(Image.open(EVAL / f"{i:06d}.jpg").convert("RGB"))[:600 + i])


@pytest.fixture(scope="module")
def alone(actor):
    """Page i's text through a plain OCRModel.recognize (one page, its own scheduler), computed once."""
    cache: dict[int, str] = {}

    def text(i: int) -> str:
        if i not in cache:
            cache[i] = actor.model.recognize(_crop(i), task="structured_parse",
                                             options=DecodeOptions(max_new_tokens=ACTOR_TOKENS)).text
        return cache[i]
    return text


def _batch(images: list, files: list[str], first_index: int = 0) -> dict:
    px = np.empty(len(images), dtype=object)
    px[:] = images
    n = len(images)
    return {"index": np.arange(first_index, first_index + n), "file": np.array(files), "page": np.zeros(n, int),
            "pixels": px, "load_ms": np.ones(n), "record": np.array([""] * n, dtype=object)}


@pytest.fixture(scope="module")
def two_calls(actor):
    """Two calls of 3 pages each on one actor at once, from two threads as Ray runs them; every decode step
    records, per scheduler, which call's pages were live in it."""
    import threading

    from edgeocr.slots import SlotScheduler

    calls = {"a": [0, 1, 2], "b": [3, 4, 5]}
    call_of = {600 + i: name for name, ids in calls.items() for i in ids}   # page height -> call
    steps: list[tuple[int, frozenset]] = []                                  # (scheduler id, calls live)
    real_step = SlotScheduler.step

    def recording_step(sched):
        live = frozenset(call_of[p.prep.letterbox.height] for p in sched.pages
                         if p is not None and p.vision is None and not p.done)
        if live:
            steps.append((id(sched), live))
        return real_step(sched)

    out: dict[str, dict] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def call(name: str) -> None:
        try:
            start.wait()
            ids = calls[name]
            out[name] = actor(_batch([_crop(i) for i in ids], [f"{i}.jpg" for i in ids], first_index=ids[0]))
        except BaseException as e:                       # re-raised on the test's thread
            errors.append(e)

    host, admit = [], []                                # threads of each page's preparation and admission
    preparer = actor.model.preparer

    class Recording:                                    # the preparer, noting which thread runs each half
        def __call__(self, image):
            host.append(threading.current_thread().name)
            return preparer(image)

        def pixels(self, prep):
            admit.append(threading.current_thread().name)
            return preparer.pixels(prep)

    SlotScheduler.step = recording_step
    actor.model.preparer = actor.engine.sched.preparer = Recording()
    t0 = time.time()
    try:
        threads = [threading.Thread(target=call, args=(name,)) for name in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        SlotScheduler.step = real_step
        actor.model.preparer = actor.engine.sched.preparer = preparer
    if errors:
        raise errors[0]
    return calls, out, steps, (t0, time.time()), (host, admit)


def test_two_calls_at_once_each_get_their_own_pages_read_as_alone(two_calls, alone):
    calls, out, _, (t0, t1), (host, admit) = two_calls
    assert len(host) == 6 and "edgeocr-queue-engine" not in host      # prepared on the calls' own threads
    assert admit == ["edgeocr-queue-engine"] * 6                     # admitted by the one engine thread
    for name, ids in calls.items():
        assert all(t0 < t <= t1 for t in out[name]["done_at"])       # when each page was finished
        assert list(out[name]["index"]) == ids
        recs = [json.loads(r) for r in out[name]["record"]]
        assert [r["file"] for r in recs] == [f"{i}.jpg" for i in ids]
        assert [r["text"] for r in recs] == [alone(i) for i in ids], name
        assert all(r["generated_tokens"] == ACTOR_TOKENS and r["timings_ms"]["load"] == 1.0 for r in recs)


def test_the_slots_take_the_next_calls_pages_while_a_call_finishes(two_calls):
    """One scheduler for both calls, and a step in which pages of both calls decode together: the slots do not
    drain at a call's end (3 pages a call in 2 slots: one call's last page shares its steps with the other's)."""
    _, _, steps, _, _ = two_calls
    assert len({sched for sched, _ in steps}) == 1, "each call had a scheduler of its own"
    assert any(live == {"a", "b"} for _, live in steps), f"no step held pages of both calls: {steps}"


def test_actor_turns_a_refused_page_and_a_failing_step_into_error_rows_of_those_pages(actor, alone, monkeypatch):
    """A page the model refuses, and one whose decode step fails (the session fails every step while that page
    is live): each is an error row; the page that shared the failing step and the others read as alone."""
    sess = actor.model.session
    guilty_px = actor.model.prepare(_crop(7)).pixels
    holds: dict[int, bool] = {}                          # slot -> it holds the guilty page
    real_encode, real_step = sess.encode_image, sess.step

    def encode_image(pixels, slot=0):
        holds[slot] = np.array_equal(pixels, guilty_px)
        return real_encode(pixels, slot)

    def step(token_ids, pos, cos, sin, live=None, *rest):
        if live is not None and any(holds.get(int(i)) for i in np.flatnonzero(live)):
            raise RuntimeError("the decoder failed")
        return real_step(token_ids, pos, cos, sin, live, *rest)

    monkeypatch.setattr(sess, "encode_image", encode_image)
    monkeypatch.setattr(sess, "step", step)
    bad = np.zeros((200, 300, 3), np.float32)            # not uint8: refused in preparation
    out = actor(_batch([_crop(0), _crop(7), bad, _crop(1)], ["p0.jpg", "guilty.jpg", "a.jpg", "c.pdf"], 7))
    assert list(out["index"]) == [7, 8, 9, 10]
    recs = [json.loads(r) for r in out["record"]]
    assert recs[1] == {"file": "guilty.jpg", "page": None,
                       "error": {"type": "RuntimeError", "message": "the decoder failed"}}
    assert recs[2] == {"file": "a.jpg", "page": None,
                       "error": {"type": "ImageError", "message": "numpy image must be uint8, got float32"}}
    monkeypatch.undo()
    assert [(r["file"], r["text"]) for r in (recs[0], recs[3])] == [("p0.jpg", alone(0)), ("c.pdf", alone(1))]
    assert recs[3]["timings_ms"]["load"] == 1.0
    assert actor.engine.running                          # the engine goes on after a failed step


def test_a_closed_engine_refuses_pages_and_a_collected_actor_stops_its_engine(demo_art, work):
    import gc

    from edgeocr.queue_engine import EngineClosed

    job = distributed.Job(model=str(demo_art), cwd=str(work), dpi=200, max_pixels=10**8, task=None, prompt=None,
                          lang="zh", options=DecodeOptions(max_new_tokens=2), cuda_graph=None)
    a = distributed.PageActor(job, distributed.Pool(1, "cpu", 1.0, 0.0, 1, "exact", 4))
    engine = a.engine
    page = a.model.page(_crop(0))
    del a
    gc.collect()
    assert not engine.running, "the engine thread outlived its actor"
    with pytest.raises(EngineClosed, match="the page engine is closed"):
        engine.submit(page)


class _Rows:
    """Ray Data's result as the driver reads it: rows {index, record, done_at}."""

    def __init__(self, rows):
        self.rows = rows

    def iter_rows(self):
        return iter({"done_at": time.time(), **r} for r in self.rows)


def test_driver_writes_each_page_once_and_reports_lost_batches(tmp_path, capsys):
    """A page that comes back twice is written once; one that never comes back (its batch failed every retry)
    becomes an error row; a page whose PDF did not open is written without Ray."""
    from argparse import Namespace

    from edgeocr.errors import ImageError

    todo = [pages.PageRef("a.png", None), pages.PageRef("b.pdf", 1), pages.PageRef("b.pdf", 2),
            pages.PageRef("c.pdf", None, error=ImageError("c.pdf: not a readable PDF"))]
    row = {"file": "a.png", "page": None, "text": "x", "finish_reason": "stop", "task": None, "lines": [],
           "prompt_tokens": 3, "generated_tokens": 1, "image_size": [10, 10], "timings_ms": {"total": 1.0}}
    rows = [{"index": 0, "record": json.dumps(row)}, {"index": 0, "record": json.dumps(row)},
            {"index": 2, "record": json.dumps({**row, "file": "b.pdf", "page": 2})}]
    path = tmp_path / "o.jsonl"
    args = Namespace(no_progress=True, out=str(path))
    pool = distributed.Pool(1, "cpu", 1.0, 0.0, 1, "exact", 2)
    rc = distributed._drive(args, _Rows(rows), todo, batchrun.JsonlWriter(path), pool)
    recs = lines_of(path)
    assert rc == 1 and len(recs) == 4
    assert sorted((r["file"], r["page"] or 0, "error" in r) for r in recs) == \
        [("a.png", 0, False), ("b.pdf", 1, True), ("b.pdf", 2, False), ("c.pdf", 0, True)]
    lost = next(r for r in recs if r["page"] == 1)
    assert lost["error"]["type"] == "RayError" and "failed on the cluster 4 times" in lost["error"]["message"]
    assert "4 pages in" in capsys.readouterr().err


def test_driver_closing_line_names_the_first_page_time_and_the_steady_rate(tmp_path, capsys):
    """Six pages the actors finished 3.0 s to 5.5 s after the run's start (the actors' rows say when): the first
    page after 3 s, then 5 more pages in 2.5 s; a page that came back twice counts once."""
    from argparse import Namespace

    t = time.time()
    todo = [pages.PageRef(f"{i}.png", None) for i in range(6)]
    row = {"page": None, "text": "x", "finish_reason": "stop", "task": None, "lines": [], "prompt_tokens": 3,
           "generated_tokens": 1, "image_size": [10, 10], "timings_ms": {"total": 1.0}}
    rows = [{"index": i, "record": json.dumps({**row, "file": f"{i}.png"}), "done_at": t + 3.0 + i / 2}
            for i in (1, 0, 2, 3, 5, 4)]
    rows.append({**rows[-1], "done_at": t + 9.0})        # a retried call's copy: written once, not counted
    path = tmp_path / "o.jsonl"
    pool = distributed.Pool(1, "cuda", 1.0, 1.0, None, "device", 2)
    rc = distributed._drive(Namespace(no_progress=True, out=str(path)), _Rows(rows), todo,
                            batchrun.JsonlWriter(path), pool)
    assert rc == 0 and len(lines_of(path)) == 6
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(r"6 pages in [\d.]+ s \([\d.]+ pages/s\): 6 ok, 0 failed -> \S+ \(1 cuda actor\(s\) on "
                        r"Ray, 2 pages per call\); first page after 3\.0 s \(actors' start and model load "
                        r"included\), then 2\.00 pages/s", last), last
    one = distributed.PageClock(0.0)
    one.finished(2.5)
    assert one.summary() == ("; first page after 2.5 s (actors' start and model load included) "
                             "(no steady rate: one page)")
    assert distributed.PageClock(0.0).summary() == ""



def test_read_task_error_rows_do_not_count_in_the_rates(tmp_path, capsys, actor):
    """A page the read task could not load comes back from the actor with done_at NaN (the actor never read it),
    and the closing line's first page and rate come from the pages the actors read."""
    from argparse import Namespace

    err = json.dumps({"file": "bad.png", "page": None, "error": {"type": "ImageError", "message": "bad.png: bad"}})
    pixels = np.empty(1, dtype=object)
    pixels[0] = np.zeros((0, 0, 3), np.uint8)             # what load_pages sends for a page it could not load
    out = actor({"index": np.array([0]), "file": np.array(["bad.png"]), "page": np.array([0]), "pixels": pixels,
                 "load_ms": np.array([0.0]), "record": np.array([err], dtype=object)})
    assert np.isnan(out["done_at"][0]) and out["record"][0] == err
    t = time.time()
    todo = [pages.PageRef("bad.png", None), pages.PageRef("a.png", None), pages.PageRef("b.png", None)]
    row = {"page": None, "text": "x", "finish_reason": "stop", "task": None, "lines": [], "prompt_tokens": 3,
           "generated_tokens": 1, "image_size": [10, 10], "timings_ms": {"total": 1.0}}
    rows = [{"index": 0, "record": err, "done_at": float("nan")},
            {"index": 1, "record": json.dumps({**row, "file": "a.png"}), "done_at": t + 4.0},
            {"index": 2, "record": json.dumps({**row, "file": "b.png"}), "done_at": t + 5.0}]
    path = tmp_path / "o.jsonl"
    rc = distributed._drive(Namespace(no_progress=True, out=str(path)), _Rows(rows), todo,
                            batchrun.JsonlWriter(path), distributed.Pool(1, "cpu", 1.0, 0.0, 1, "exact", 2))
    assert rc == 1 and len(lines_of(path)) == 3
    assert "first page after 4.0 s (actors' start and model load included), then 1.00 pages/s" in \
        capsys.readouterr().err

def test_parquet_journal_survives_a_kill_and_is_folded_in(tmp_path):
    path = tmp_path / "o.parquet"
    row = {"file": "a.png", "page": None, "text": "x", "finish_reason": "stop", "task": "spotting",
           "lines": [{"text": "x", "box": [1, 2, 3, 4], "box_norm": [5, 6, 7, 8]}], "prompt_tokens": 3,
           "generated_tokens": 1, "image_size": [10, 10], "timings_ms": {"total": 1.5, "load": 0.25}}
    err = {"file": "b.png", "page": None, "error": {"type": "ImageError", "message": "b.png: bad"}}
    assert parquet_out.prepare(path).kept == 0
    out = parquet_out.ParquetOut(path)
    out.write(row)
    out.write(err)
    out.journal.close()                                  # killed before close(): no Parquet file, a journal
    assert not path.exists()
    with pytest.raises(batchrun.OutputError, match="journal of an interrupted run"):
        parquet_out.prepare(path)
    state = parquet_out.prepare(path, resume=True)
    assert state.done == {("a.png", None)} and state.retried == 1 and state.failed == {("b.png", None)}
    out = parquet_out.ParquetOut(path)
    out.write({**row, "file": "b.png"})
    out.close()
    assert parquet_out.read_records(path) == [row, {**row, "file": "b.png"}]
    assert not parquet_out.journal_path(path).exists()
    with pytest.raises(batchrun.OutputError, match="fields the Parquet schema lacks: colour"):
        parquet_out.to_table([{**row, "colour": 1}])
