"""`edgeocr run --ray`: the batch run spread over the GPUs (or CPUs) of a Ray cluster with Ray Data.

    edgeocr run scans/ --model ART --ray local --out pages.jsonl          # a private Ray on this machine
    edgeocr run /data/scans --model /data/art --ray auto --out /data/pages.parquet    # the running cluster

The driver lists the pages as a local run does (edgeocr.pages: files, folders, globs, PDF pages) and skips
those the --out file already holds.  The rest go through a Ray Data pipeline:

    page list (driver) ─► read tasks: PageLoader.load → pixels [H, W, 3] uint8, or the page's error row
                       ─► actor pool: each actor loads the artifact once and starts one engine thread that drives
                          one scheduler for the actor's life (edgeocr.queue_engine); CALLS_PER_ACTOR calls of
                          `batch_pages` pages run at once, each preparing its pages on its own thread and queueing
                          them for the engine, so a slot freed by one call's last page takes the next call's page;
                          one GPU per actor on a cluster with GPUs, CPU actors otherwise
                       ─► driver: one row per page, as it comes back, in the local run's schema; the closing line
                          gives the whole time, the time to the first page and the rate from it to the last

A page that fails (unreadable, refused by the model) is an error row, as locally.  An actor that dies is
restarted by Ray and its batch run again; the driver writes each page once, and a page whose batch keeps
killing its actor ends as an error row rather than stopping the run.  Ray is imported here only.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import sys
import time
import warnings
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeocr import batchrun, pages
from edgeocr.decode import DecodeOptions
from edgeocr.errors import EdgeOCRError

log = logging.getLogger("edgeocr")

PAGES_PER_SLOT = 2        # pages per actor call, per artifact slot
READ_CPUS = 1.0           # logical CPUs a read task reserves; `--ray local` keeps this many beyond the actors'
CALLS_PER_ACTOR = 2       # actor calls in flight at once: the next call's pages queue while this one's last decode
ACTOR_RETRIES = 3         # times a batch is run again after its actor died (the actor is restarted each time)
ADDRESS_ENV = "RAY_ADDRESS"   # set by `ray job submit`: a bare --ray then joins that cluster


class RayError(EdgeOCRError):
    """Ray is missing, or the cluster cannot be reached or cannot run the pool asked for."""


@dataclass(frozen=True)
class Job:
    """What the read tasks and the actors need; sent to every node."""

    model: str                       # artifact directory, absolute (the same path on every node)
    cwd: str                         # the driver's working directory: relative input paths are read from it
    dpi: float                       # PDF rasterization
    max_pixels: int                  # pixel limit for images and rendered PDF pages
    task: str | None
    prompt: str | None
    lang: str
    options: DecodeOptions
    cuda_graph: bool | None          # None: the model's default for the device
    vision_ahead: bool | None = None # None: EDGEOCR_VISION_AHEAD in the actor's environment, else off


@dataclass(frozen=True)
class Pool:
    """The actors that recognize pages."""

    actors: int                      # actors in the pool
    device: str                      # "cuda" (one GPU each) or "cpu"
    cpus: float                      # logical CPUs each actor reserves
    gpus: float                      # GPUs each actor reserves: 1 or 0
    threads: int | None              # ONNX Runtime threads of a CPU actor (None: the default)
    preprocess: str                  # exact | fast | device (OCRModel's preprocess)
    batch_pages: int                 # pages per actor call


# ---------------------------------------------------------------------------------------------- ray
def import_ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as e:
        raise RayError(f"--ray needs Ray Data: pip install 'edgeocr[ray]' ({e})") from None
    return ray


def connect(ray, address: str, local_cpus: float, verbose: bool) -> None:
    """`local`: start a private Ray here with `local_cpus` logical CPUs; `auto`: the cluster RAY_ADDRESS
    names or `ray start` left on this machine; else a cluster address (host:6379, ray://host:10001)."""
    quiet = logging.INFO if verbose else logging.ERROR
    try:
        if address == "local":
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(address="local", num_cpus=math.ceil(local_cpus), include_dashboard=False, logging_level=quiet)
        else:
            ray.init(address=address, logging_level=quiet)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise RayError(f"--ray {address}: no Ray cluster could be reached ({str(e).strip().splitlines()[0]})") from None
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False                 # the page bar below is the progress
    ctx.max_errored_blocks = -1                      # a batch that keeps failing: its pages become error rows
    if not verbose:
        data_log = logging.getLogger("ray.data")
        data_log.setLevel(logging.WARNING)
        logging.getLogger("ray.data._internal.progress").addFilter(   # our bar is on: no need to say theirs is off
            lambda rec: not rec.getMessage().startswith("Progress bars disabled"))


def bad_count(actors: int | None, threads: int | None, call_pages: int | None) -> str | None:
    """The message for the first of --ray-actors, --threads, --ray-call-pages given below 1, else None."""
    for flag, value in (("--ray-actors", actors), ("--threads", threads), ("--ray-call-pages", call_pages)):
        if value is not None and value < 1:
            return f"{flag} must be a positive integer, got {value}"
    return None


def plan_pool(resources: dict, actors: int | None, threads: int | None, preprocess: str, device: str,
              slots: int, pages: int, call_pages: int | None = None) -> Pool:
    """One actor per GPU where the cluster has GPUs; else CPU actors of `threads` threads (default 1), as
    many as fit beside one read task.  `actors` overrides the count.  An actor call takes `call_pages` pages
    (default PAGES_PER_SLOT per slot), fewer when `pages` would otherwise leave an actor without work."""
    if (bad := bad_count(actors, threads, call_pages)) is not None:
        raise RayError(bad)
    gpus = int(resources.get("GPU", 0))
    if gpus:
        if device != "cuda":                        # the run's default (cpu) preprocess: use the GPU's default
            from edgeocr.bench import default_preprocess
            preprocess = default_preprocess("cuda")
        n, dev, cpus, gpu, t = actors or gpus, "cuda", 1.0, 1.0, None
    else:
        t = threads or 1
        n, dev, cpus, gpu = actors or max(1, int((resources.get("CPU", 1) - READ_CPUS) // t)), "cpu", float(t), 0.0
    batch = max(1, min(call_pages or max(1, slots) * PAGES_PER_SLOT, math.ceil(pages / n)))
    return Pool(n, dev, cpus, gpu, t, preprocess, batch)


def local_cpus(actors: int | None, threads: int | None) -> float:
    """Logical CPUs for `--ray local`: the machine's, and at least the actors' plus one read task's, so the
    actors cannot take every CPU and starve the tasks that read pages."""
    machine = os.cpu_count() or 1
    if actors is None:
        return float(machine)
    return max(float(machine), actors * (threads or 1) + READ_CPUS)


# ---------------------------------------------------------------------------------------------- workers
def _page(value) -> int | None:
    return int(value) or None                        # 0 in the dataset: an image file (no page)


def load_pages(batch: dict, job: Job) -> dict:
    """Read task: a batch of pages {index, file, page} -> {..., pixels, load_ms, record}; a page that cannot
    be loaded gets its error row in `record` (empty otherwise) and empty pixels."""
    if job.cwd != os.getcwd() and os.path.isdir(job.cwd):
        os.chdir(job.cwd)                            # relative inputs, and their messages, as on the driver
    pixels, load_ms, records = [], [], []
    with pages.PageLoader(dpi=job.dpi, max_pixels=job.max_pixels) as loader:
        for file, page in zip(batch["file"], batch["page"]):
            ref = pages.PageRef(str(file), _page(page))
            t0 = time.perf_counter()
            try:
                img, rec = loader.load(ref), ""       # [H, W, 3] uint8
            except Exception as e:                   # an EdgeOCRError names the file; anything else too
                img = np.zeros((0, 0, 3), np.uint8)
                rec = json.dumps(batchrun.PageOutcome(ref, error=e).record(), ensure_ascii=False)
            pixels.append(img)
            load_ms.append((time.perf_counter() - t0) * 1e3)
            records.append(rec)
    px = np.empty(len(pixels), dtype=object)
    px[:] = pixels
    return {"index": batch["index"], "file": batch["file"], "page": batch["page"], "pixels": px,
            "load_ms": np.asarray(load_ms), "record": np.asarray(records, dtype=object)}


class PageActor:
    """Loads the artifact once and starts its engine (edgeocr.queue_engine: one thread driving one scheduler
    for the actor's life).  Ray runs CALLS_PER_ACTOR calls at once, each on its own thread: a call prepares its
    pages there (OCRModel.page), queues them for the engine and waits for its own pages' results, so the next
    call's pages take the slots that this call's last pages leave."""

    def __init__(self, job: Job, pool: Pool):
        from edgeocr.model import OCRModel
        from edgeocr.queue_engine import QueueEngine

        self.job = job
        self.model = OCRModel(job.model, device=pool.device, threads=pool.threads, cuda_graph=job.cuda_graph,
                              preprocess=pool.preprocess, vision_ahead=job.vision_ahead)
        self.engine = QueueEngine(self.model)
        self._calls = itertools.count()
        weakref.finalize(self, self.engine.close)       # garbage-collected (Ray ends the actor): the thread stops

    def __call__(self, batch: dict) -> dict:
        """{index, file, page, pixels, load_ms, record} -> {index, record, done_at}: every page's JSONL row and
        when the actor finished it (time.time() of the engine's result or of the refusal; NaN for the read task's
        error rows, which the actor did not read: they do not count in the closing line's rates)."""
        j, call = self.job, next(self._calls)
        records = [str(r) for r in batch["record"]]
        done_at = np.full(len(records), np.nan)
        outcomes: dict[int, object] = {}                  # position -> Future, or the error that refused the page
        for k, rec in enumerate(records):
            if rec:
                continue                                  # the read task's error row
            try:
                page = self.model.page(batch["pixels"][k], task=j.task, prompt=j.prompt, lang=j.lang,
                                       options=j.options)
            except Exception as e:                        # refused (bad image, bad prompt): its error row
                outcomes[k], done_at[k] = e, time.time()
                continue
            outcomes[k] = self.engine.submit(page, tag=call)
        for k, outcome in outcomes.items():
            ref = pages.PageRef(str(batch["file"][k]), _page(batch["page"][k]))
            if isinstance(outcome, Future):
                fut = outcome
                try:
                    outcome = fut.result()
                except Exception as e:                    # failed in the engine (its vision, its decode step)
                    outcome = e
                done_at[k] = fut.finished_at
            o = batchrun.PageOutcome(ref, error=outcome) if isinstance(outcome, BaseException) else \
                batchrun.PageOutcome(ref, result=outcome, load_ms=float(batch["load_ms"][k]))
            records[k] = json.dumps(o.record(), ensure_ascii=False)
        return {"index": batch["index"], "record": np.asarray(records, dtype=object), "done_at": done_at}


# ---------------------------------------------------------------------------------------------- driver
def build(ray, todo: list[pages.PageRef], job: Job, pool: Pool):
    """The Ray Data pipeline over `todo`: rows {index, record} (index into `todo`, record a JSON line)."""
    from ray.data import ActorPoolStrategy

    items = [{"index": i, "file": r.file, "page": r.page or 0} for i, r in enumerate(todo) if r.error is None]
    ds = ray.data.from_items(items, override_num_blocks=max(1, math.ceil(len(items) / pool.batch_pages)))
    ds = ds.map_batches(load_pages, fn_kwargs={"job": job}, batch_size=pool.batch_pages, num_cpus=READ_CPUS,
                        batch_format="numpy")
    with warnings.catch_warnings():
        # Ray Data restarts a dead actor and retries its batch without end by default; a page that kills every
        # actor would then stop the run.  The retry bound is a plain Ray remote argument, deprecated in map_batches
        # (removed in Ray 2.64; the ray extra pins the version this was tested with).
        warnings.filterwarnings("ignore", "`ray_remote_args` is deprecated")
        # CALLS_PER_ACTOR calls at once on each actor, each on its own thread (the engine keeps the slots busy)
        pool_of_actors = ActorPoolStrategy(size=pool.actors, max_concurrent_calls_per_actor=CALLS_PER_ACTOR,
                                           enable_true_multi_threading=True)
        return ds.map_batches(PageActor, fn_constructor_kwargs={"job": job, "pool": pool},
                              batch_size=pool.batch_pages, batch_format="numpy", compute=pool_of_actors,
                              num_cpus=pool.cpus, num_gpus=pool.gpus or None, max_restarts=-1,
                              max_task_retries=ACTOR_RETRIES)


def run(args) -> int:
    """`edgeocr run ... --ray`: the same inputs, --out, --resume and messages as a local run."""
    from edgeocr import artifact, cli

    if not args.out:
        return cli._usage("--ray writes its pages to a file: pass --out FILE.jsonl or FILE.parquet")
    if args.remote:
        return cli._usage("--ray and --remote exclude each other")
    if args.stream:
        return cli._usage("--stream is for local runs, not --ray")
    if (bad := bad_count(args.ray_actors, args.threads, args.ray_call_pages)) is not None:
        return cli._usage(bad)                          # before Ray is imported or started
    parquet = Path(args.out).suffix.lower() == ".parquet"
    ray = import_ray()
    try:
        limit = cli.preprocess_limit(args.max_pixels)
        refs = pages.list_pages(pages.list_files(args.images))
        if parquet:
            from edgeocr import parquet_out
            state = parquet_out.prepare(args.out, args.resume, args.overwrite)
        else:
            state = batchrun.prepare_output(args.out, args.resume, args.overwrite)
    except (pages.InputPathError, batchrun.OutputError) as e:
        return cli._usage(str(e))
    slots = artifact.read(Path(args.model)).kv.slots          # a bad --model fails here, before Ray starts
    todo = cli._pending(refs, state, args.out)
    if not todo:
        return cli.EXIT_OK
    job = Job(model=str(Path(args.model).resolve()), cwd=os.getcwd(), dpi=args.dpi, max_pixels=limit,
              task=args.task, prompt=args.prompt, lang=args.lang,
              options=DecodeOptions(max_new_tokens=args.max_new_tokens, repetition_penalty=args.repetition_penalty),
              cuda_graph=cli._GRAPH[args.cuda_graph], vision_ahead=cli._GRAPH[args.vision_ahead])
    connect(ray, args.ray, local_cpus(args.ray_actors, args.threads), args.verbose)
    try:
        pool = plan_pool(ray.cluster_resources(), args.ray_actors, args.threads, args.preprocess, args.device, slots,
                         pages=sum(r.error is None for r in todo), call_pages=args.ray_call_pages)
        log.info("ray: %d %s actor(s), %d pages per call, %d pages", pool.actors, pool.device, pool.batch_pages,
                 len(todo))
        if parquet:
            from edgeocr.parquet_out import ParquetOut
            out = ParquetOut(args.out)
        else:
            out = batchrun.JsonlWriter(args.out)
        return _drive(args, build(ray, todo, job, pool), todo, out, pool)
    finally:
        ray.shutdown()


class PageClock:
    """When the actors finished the pages, by the wall clock of the actor that read each (time.time(); nodes'
    clocks agree to NTP's precision): the time from the run's start to the first page (the actors' start and
    model loads, then that page) and the rate from the first page to the last, the steady rate a long run sees."""

    def __init__(self, start: float):
        self.start = start                # time.time() before the pipeline starts
        self.first = math.inf             # time.time() when the first page was finished
        self.last = -math.inf             # ... the last
        self.pages = 0

    def finished(self, at: float) -> None:
        self.first, self.last, self.pages = min(self.first, at), max(self.last, at), self.pages + 1

    def summary(self) -> str:
        """The closing line's tail: "" when no page came back from the actors."""
        if not self.pages:
            return ""
        head = f"; first page after {self.first - self.start:.1f} s (actors' start and model load included)"
        if self.pages < 2 or self.last <= self.first:
            return head + " (no steady rate: one page)"
        return head + f", then {(self.pages - 1) / (self.last - self.first):.2f} pages/s"


def _drive(args, ds, todo: list[pages.PageRef], out, pool: Pool) -> int:
    """Write each page's row once as rows come back, with the local run's bar, messages and exit code."""
    from tqdm import tqdm

    from edgeocr import cli

    show_bar = not args.no_progress and sys.stderr.isatty()
    sized = show_bar and cli._terminal_sized()
    bar = tqdm(total=len(todo), unit="page", file=sys.stderr, disable=not show_bar,
               dynamic_ncols=sized, ncols=None if sized else 80, nrows=None if sized else 24)
    say = (lambda msg: bar.write(msg, file=sys.stderr)) if show_bar else (lambda msg: print(msg, file=sys.stderr))
    counts = {"ok": 0, "failed": 0}
    written: set[int] = set()
    t0, clock = time.perf_counter(), PageClock(time.time())      # before Ray Data starts the actors

    def write(i: int, rec: dict) -> bool:
        if i in written:
            log.warning("%s came back twice (a retried batch); kept once", todo[i].label)
            return False
        written.add(i)
        out.write(rec)
        ok = "error" not in rec
        counts["ok" if ok else "failed"] += 1
        if not ok:
            say(f"error: {rec['error']['message']}")
        elif not show_bar:
            say(cli._summary_line(rec, todo[i].label) + " (ray)")
        bar.update(1)
        return True

    interrupted = False
    try:
        for i, ref in enumerate(todo):               # listed on the driver but not openable: no Ray work
            if ref.error is not None:
                write(i, batchrun.PageOutcome(ref, error=ref.error).record())
        for row in ds.iter_rows():
            if write(int(row["index"]), json.loads(row["record"])) and not math.isnan(at := float(row["done_at"])):
                clock.finished(at)
        for i, ref in enumerate(todo):               # batches that failed ACTOR_RETRIES times
            if i not in written:
                write(i, batchrun.PageOutcome(ref, error=RayError(
                    f"{ref.label}: not recognized: its batch failed on the cluster {ACTOR_RETRIES + 1} times "
                    f"(actor lost or task error; see the Ray logs)")).record())
    except KeyboardInterrupt:
        interrupted = True
    finally:
        bar.close()
        out.close()
    done = counts["ok"] + counts["failed"]
    secs = time.perf_counter() - t0
    print(f"{done} pages in {secs:.1f} s ({done / max(secs, 1e-9):.2f} pages/s): {counts['ok']} ok, "
          f"{counts['failed']} failed -> {args.out} ({pool.actors} {pool.device} actor(s) on Ray, "
          f"{pool.batch_pages} pages per call){clock.summary()}", file=sys.stderr)
    if interrupted:
        print(f"interrupted: {len(todo) - done} of {len(todo)} pages not done; run again with --resume to finish "
              f"{args.out}", file=sys.stderr)
        return cli.EXIT_INTERRUPTED
    return cli.EXIT_ERROR if counts["failed"] else cli.EXIT_OK
