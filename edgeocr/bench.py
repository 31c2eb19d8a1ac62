"""`edgeocr bench`: per-stage timings, tokens/s, peak memory.

Fixed-output-length mode (stop ids and the repetition stop ignored) makes runs comparable.  The same job on
transformers is the toolchain's (`python -m quantize bench-hf`, quantize.compare): it calls `bench` /
`bench_pages` here and prints its figures beside these with `format_table` / `format_pages`.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgeocr.decode import DecodeOptions
from edgeocr.selection import RepetitionPenalty

# Peak DRAM bandwidth by GPU name fragment, GB/s (datasheets), for the decode floor.
BANDWIDTH_GBS = {"H200": 4800.0, "H100": 3350.0, "4090": 1008.0, "Orin": 204.8, "A100": 2039.0, "L4": 300.0}


def default_preprocess(device: str, backend: str = "onnxruntime") -> str:
    """The preprocessing path OCRModel, `edgeocr bench` and `edgeocr run` use when none is named: on CUDA the
    device path (the host only decodes the image; resize and normalization with the artifact's mean/std run on
    the GPU in two kernels bit-identical to Pillow's bicubic, edgeocr.letterbox_cuda); on the H200 (2026-12-04,
    then still an ONNX graph within a level of Pillow) the first token from the file came 30.8 ms after it against
    62.5 ms on the exact host path.  On the CPU, and with the TensorRT backend (whose engines take host pixels),
    the exact path (the reference processor)."""
    return "device" if device == "cuda" and backend == "onnxruntime" else "exact"


FIRST_TOKEN_RUNS = 7        # CUDA: one-token calls whose median first token the bench reports beside the timed page


@dataclass
class BenchResult:
    backend: str
    precision: str
    device_name: str
    prompt_tokens: int
    new_tokens: int
    load_ms: float
    preprocess_ms: float
    vision_ms: float
    prefill_ms: float
    first_token_ms: float           # image in -> first token chosen (preprocess + vision + prefill + 1st argmax)
                                    # (preprocess_ms: read, decode, letterbox; the device path's letterbox included)
    decode_ms_per_token: float      # mean over all decode steps
    decode_ms_by_position: dict     # mean step time over the first/middle/last quarter of steps
    tokens_per_s: float
    total_ms: float
    peak_rss_mib: float
    peak_device_mib: float | None
    kv_cache_mib: float
    decoder_weight_mib: float
    bandwidth_floor_ms: float | None  # weights + live KV per step / peak bandwidth
    step_copies: dict | None = None   # bytes each decode step moves outside the graph, by construction
    flavour: str = ""                 # decoder attention / selection / CUDA graph
    preprocess: str = ""              # preprocessing path: exact | fast | device
    threads: str = ""                 # ONNX Runtime intra-op threads of the sessions (CPU)
    cpu_profile: dict | None = None   # CPU: ONNX Runtime's own profile of decode steps (cpu_step_profile)
    first_token_median: dict | None = None   # medians over FIRST_TOKEN_RUNS one-token calls: from the file, and
                                              # its preprocess / vision / prefill parts (ms); letterbox_ms: the
                                              # device path's letterbox on the GPU, part of preprocess_ms;
                                              # from_pixels_ms: admission to the first token less the letterbox


def step_copies(art, live_slots: int = 1, engine: str = "onnxruntime") -> dict:
    """What one decode step copies outside the graph, by construction of the sessions' bindings
    (edgeocr.backends.ort): every slot's inputs go in, every slot's logits or token ids come back.  A decoder with
    device-resident step state (edgeocr.backends.ort_step_state), or the native step (edgeocr.backends.native_step,
    `engine` not "onnxruntime"), takes nothing from the host in a step; only admissions and leaves write its
    buffers."""
    n, kv = art.slots, art.kv
    inplace, selects = art.decoder.attention == "gqa", art.decoder.select_on_device
    if art.decoder.step_state or engine != "onnxruntime":
        return {"host_to_device": 0, "device_to_host": n * 8, "cache_rows_device_to_device": 0}
    h2d = n * (8 + 2 * 4 * kv.head_dim)                           # token ids, cos, sin
    h2d += n * (4 if inplace else 8)                              # seqlens_k | past_len
    d2h = n * (8 if selects else 4 * art.vocab_size)              # token ids | logits
    if selects:
        h2d += 4 * live_slots                                     # one 'seen' flag per live slot
    d2d = 0 if inplace else live_slots * kv.bytes_per_token       # new K/V rows into the cache
    return {"host_to_device": h2d, "device_to_host": d2h, "cache_rows_device_to_device": d2d}


def physical_cores() -> int:
    """Physical cores this process may run on (ONNX Runtime's default intra-op thread count); logical CPUs
    where /proc/cpuinfo does not say."""
    try:
        allowed = os.sched_getaffinity(0)
        cores, cpu = set(), None
        with open("/proc/cpuinfo") as f:
            phys = core = None
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "processor":
                    cpu = int(val)
                elif key == "physical id":
                    phys = val.strip()
                elif key == "core id":
                    core = val.strip()
                    if cpu in allowed:
                        cores.add((phys, core))
        return len(cores) or len(allowed)
    except (OSError, ValueError, AttributeError):
        return os.cpu_count() or 1


def thread_label(threads: int | None) -> str:
    from edgeocr.ort_options import cpu_session_config
    spin = "no spinning" if cpu_session_config() else "spinning"
    return (f"{threads} (--threads), {spin}" if threads else
            f"{physical_cores()} (ONNX Runtime default: one per physical core), {spin}")


def cpu_step_profile(model, last, threads: int | None, steps: int = 8) -> dict:
    """ONNX Runtime's profiler over `steps` decode steps that continue `last` (the OCRResult of a run on slot 0,
    whose cache rows are still in place), on a second, profiled decoder session over the same buffers.  Returns
    the step's wall time, the time inside ONNX Runtime's CPU kernels (the share of the step they take; the
    rest is the Python loop, bindings and the session's own overhead) and the op types that take most of it.
    The first profiled step (the new session's warm-up) is left out."""
    import tempfile

    s = model.session
    ort = s._ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    so.enable_profiling = True
    from edgeocr.ort_options import cpu_session_config
    for key, value in cpu_session_config().items():
        so.add_session_config_entry(key, value)
    if threads:
        so.intra_op_num_threads = threads
    tmp = tempfile.mkdtemp(prefix="edgeocr-profile-")
    so.profile_file_prefix = os.path.join(tmp, "decoder")
    art = model.artifact
    plain = s.decoder
    s.decoder = ort.InferenceSession(str(model.path / art.decoder.file), so, providers=["CPUExecutionProvider"])
    s._bind_step()
    walls = []
    try:
        n = s.slots
        start = min(last.prompt_tokens + last.generated_tokens, art.cache_len - steps - 1)
        token = np.full((n,), last.token_ids[-1] if last.token_ids else art.tokens.pad, np.int64)
        live = np.zeros((n,), bool)
        live[0] = True
        nxt = np.zeros((n,), np.int64)
        select = s.selection()
        if select.where == "host":            # a seen set for the slot the profile steps
            select.penalties[0] = RepetitionPenalty(s.vocab_size, 1.0, token[:1])
        for k in range(steps + 1):
            pos = np.zeros((n,), np.int64)
            pos[0] = start + k
            t = time.perf_counter()
            select.next(token, pos, model.table_cos[pos], model.table_sin[pos], live, nxt)
            walls.append((time.perf_counter() - t) * 1e3)
        trace = s.decoder.end_profiling()
    finally:
        s.decoder = plain
        s._bind_step()
    with open(trace) as f:
        events = json.load(f)
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[1:]
    t0 = runs[0]["ts"] if runs else 0
    by_op: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and e["ts"] >= t0:
            op = e.get("args", {}).get("op_name", "?")
            by_op[op] = by_op.get(op, 0.0) + e["dur"] / 1e3
    k = max(len(runs), 1)
    step_ms = statistics.mean(walls[1:])
    kernel_ms = sum(by_op.values()) / k
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:6]
    return {"steps": len(runs), "position": int(start + 1), "step_ms": step_ms,
            "session_run_ms": statistics.mean(e["dur"] / 1e3 for e in runs) if runs else None,
            "kernel_ms": kernel_ms, "kernel_share": kernel_ms / step_ms if step_ms else None,
            "top_ops_ms": {op: ms / k for op, ms in top}}


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _gpu_name() -> str:
    try:
        import subprocess
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=10).stdout.strip().splitlines()[0]
    except Exception:
        return ""


def _bandwidth(name: str) -> float | None:
    for k, v in BANDWIDTH_GBS.items():
        if k in name:
            return v
    return None


def bench(artifact: str | Path, image, device: str = "cpu", tokens: int = 64, repeats: int = 1,
          task: str = "spotting", threads: int | None = None, cuda_graph: bool | None = None,
          preprocess: str | None = None, first_token_runs: int | None = None) -> BenchResult:
    """preprocess: exact | fast | device; None = default_preprocess(device).  first_token_runs: one-token calls
    after the timed page whose medians are reported as first_token_median (None: FIRST_TOKEN_RUNS on CUDA, none
    on the CPU, where each costs a vision pass of seconds)."""
    from edgeocr.model import OCRModel

    preprocess = preprocess or default_preprocess(device)
    t0 = time.perf_counter()
    model = OCRModel(artifact, device=device, threads=threads, cuda_graph=cuda_graph, preprocess=preprocess)
    load_ms = (time.perf_counter() - t0) * 1e3
    opts = DecodeOptions(max_new_tokens=tokens, ignore_stop=True, tail_repetition_stop=False)
    cuda = None
    if device == "cuda":
        from edgeocr.backends import cudart
        cuda = cudart.load()
    model.recognize(image, task=task, options=DecodeOptions(max_new_tokens=4, ignore_stop=True))   # warm-up
    runs = []
    peak_dev = None
    for _ in range(max(1, repeats)):
        res = model.recognize(image, task=task, options=opts)
        runs.append(res)
        if cuda is not None:
            free, total = cuda.mem_info()
            used = (total - free) / 2**20
            peak_dev = used if peak_dev is None else max(peak_dev, used)
    res = min(runs, key=lambda r: r.timings_ms["total"])
    # on CUDA the first token alone, several times: one call's figure moves by several ms with the host
    med = None
    n_first = FIRST_TOKEN_RUNS if first_token_runs is None and device == "cuda" else (first_token_runs or 0)
    if n_first:
        one = DecodeOptions(max_new_tokens=1, ignore_stop=True)
        tt = [model.recognize(image, task=task, options=one).timings_ms for _ in range(n_first)]
        med = {k: statistics.median(fn(t) for t in tt) for k, fn in (
            ("from_file_ms", lambda t: t["load"] + t["preprocess"] + t["first_token"]),
            ("from_pixels_ms", lambda t: t["first_token"] - t.get("letterbox", 0.0)),
            ("preprocess_ms", _prepared_ms), ("letterbox_ms", lambda t: t.get("letterbox", 0.0)),
            ("vision_ms", lambda t: t["vision"]), ("prefill_ms", lambda t: t["prefill"]))}
        med["runs"] = n_first
    steps = list(res.step_ms)
    t = res.timings_ms
    q = max(1, len(steps) // 4)
    by_pos = {"first_quarter": statistics.mean(steps[:q]) if steps else 0.0,
              "middle": statistics.mean(steps[q:-q]) if len(steps) > 2 * q else 0.0,
              "last_quarter": statistics.mean(steps[-q:]) if steps else 0.0}
    m = model.artifact
    dec_bytes = sum(v["bytes"] for k, v in m.files.items()
                    if k.startswith(m.decoder.file) or k == m.decoder.native_step.get("file"))
    kv = model.session.memory_bytes()["kv_cache"]
    name = _gpu_name() if device == "cuda" else "cpu"
    bw = _bandwidth(name)
    live_kv = m.kv.bytes_per_token * (res.prompt_tokens + tokens / 2)
    floor = ((dec_bytes + live_kv) / (bw * 1e9) * 1e3) if bw else None
    per_tok = statistics.mean(steps) if steps else 0.0
    engine = getattr(model.session, "engine", "onnxruntime")         # the native step runs no ONNX Runtime step
    prof = cpu_step_profile(model, res, threads) if device == "cpu" and engine == "onnxruntime" \
        else None
    return BenchResult(
        backend=model.session.name, precision=m.precision, device_name=name, prompt_tokens=res.prompt_tokens,
        new_tokens=res.generated_tokens, load_ms=load_ms, preprocess_ms=_prepared_ms(t),
        vision_ms=t["vision"], prefill_ms=t["prefill"], first_token_ms=t["load"] + t["preprocess"] + t["first_token"],
        decode_ms_per_token=per_tok, decode_ms_by_position=by_pos,
        tokens_per_s=1e3 / per_tok if per_tok else 0.0, total_ms=t["total"], peak_rss_mib=_rss_mib(),
        peak_device_mib=peak_dev, kv_cache_mib=kv / 2**20, decoder_weight_mib=dec_bytes / 2**20,
        bandwidth_floor_ms=floor, step_copies=step_copies(m, engine=engine),
        threads=thread_label(threads) if device == "cpu" else "", cpu_profile=prof, first_token_median=med,
        flavour=(f"attention {m.decoder.attention}, selection "
                 f"{'in graph' if m.decoder.select_on_device else 'host'}, "
                 f"{'step state on the device, ' if m.decoder.step_state else ''}"
                 f"{'native step weights (step: ' + model.session.engine + '), ' if m.decoder.native_step else ''}"
                 f"CUDA graph {'on' if step_graph(model.session) else 'off'}{replay_label(model.session)}"),
        preprocess=preprocess)


def _prepared_ms(t: dict) -> float:
    """A result's preprocessing: read and decode, letterbox and normalize, on the host or (the device path, at
    admission, inside its first_token time) on the GPU.  The first token from the file (load + preprocess +
    first_token) less this is the first token from pixels (vision, prefill, the first selection)."""
    return t["load"] + t["preprocess"] + t.get("letterbox", 0.0)


def replay_label(session) -> str:
    """", prefill / vision CUDA graphs on|off" for a session that may replay them (ONNX Runtime on CUDA), else ""."""
    if not hasattr(session, "prefill_graph") or getattr(session, "device", "") != "cuda":
        return ""
    prefill, vision = ("on" if g else "off" for g in (session.prefill_graph, session.vision_graph))
    return f", prefill / vision CUDA graphs {prefill} / {vision}"


def step_graph(session) -> bool:
    """Whether the decode step replays a CUDA graph: ONNX Runtime's, or the native step's own."""
    return bool(getattr(session, "step_cuda_graph", getattr(session, "cuda_graph", False)))


def _median_line(m: dict) -> str:
    lb = f", device letterbox {m['letterbox_ms']:.1f}" if m.get("letterbox_ms") else ""
    return (f"{m['from_file_ms']:.1f} ms, from pixels {m['from_pixels_ms']:.1f} ms (preprocess "
            f"{m['preprocess_ms']:.1f}{lb} / vision {m['vision_ms']:.1f} / prefill {m['prefill_ms']:.1f} ms)")


def format_table(r: BenchResult, hf: dict | None = None) -> str:
    rows = [("backend", r.backend, ""), ("precision", r.precision, ""), ("device", r.device_name, ""),
            ("decoder flavour", r.flavour, ""),
            ("prompt / new tokens", f"{r.prompt_tokens} / {r.new_tokens}", ""),
            ("load", f"{r.load_ms:.0f} ms", ""), ("image decode + preprocess", f"{r.preprocess_ms:.1f} ms", r.preprocess),
            ("vision", f"{r.vision_ms:.1f} ms", ""), ("prefill", f"{r.prefill_ms:.1f} ms", ""),
            ("time to first token", f"{r.first_token_ms:.1f} ms", ""),
            *([(f"  median of {r.first_token_median['runs']} calls", _median_line(r.first_token_median), "")]
              if r.first_token_median else []),
            ("decode per token", f"{r.decode_ms_per_token:.3f} ms", ""),
            ("  by position (first/mid/last quarter)",
             " / ".join(f"{v:.3f}" for v in r.decode_ms_by_position.values()) + " ms", ""),
            ("tokens/s", f"{r.tokens_per_s:.1f}", ""), ("total", f"{r.total_ms:.0f} ms", ""),
            ("peak host RSS", f"{r.peak_rss_mib:.0f} MiB", ""),
            ("device memory in use", f"{r.peak_device_mib:.0f} MiB" if r.peak_device_mib else "n/a", ""),
            ("KV cache", f"{r.kv_cache_mib:.1f} MiB", ""), ("decoder weights", f"{r.decoder_weight_mib:.1f} MiB", ""),
            ("decode bandwidth floor", f"{r.bandwidth_floor_ms:.3f} ms" if r.bandwidth_floor_ms else "n/a", "")]
    if r.step_copies:
        c = r.step_copies
        rows.append(("copies per step (H2D / D2H / cache D2D)",
                     f"{c['host_to_device']} B / {c['device_to_host']} B / {c['cache_rows_device_to_device']} B", ""))
    if r.threads:
        rows.insert(4, ("threads (intra-op)", r.threads, ""))
    p = r.cpu_profile
    if p:
        rows.append(("ORT CPU kernels per step (profiled)", f"{p['kernel_ms']:.2f} ms of a {p['step_ms']:.2f} ms "
                     f"step ({100 * p['kernel_share']:.0f} %), {p['steps']} steps at position {p['position']} run "
                     "again with ONNX Runtime's profiler on, which slows them", ""))
        rows.append(("  top ops", ", ".join(f"{op} {ms:.2f}" for op, ms in p["top_ops_ms"].items()) + " ms", ""))
    out = [f"{k:40s} {v}" for k, v, _ in rows]
    if hf:
        out.append(f"--- transformers generate ({hf['dtype']}, {hf['attn']}) on the same image and prompt")
        model_ttft = r.first_token_ms - r.preprocess_ms   # both from the same preprocessed input
        out.append(f"{'time to first token (from pixels)':40s} {hf['first_token_ms']:.1f} ms  vs edgeocr "
                   f"{model_ttft:.1f} ms ({hf['first_token_ms'] / model_ttft:.2f}x)")
        out.append(f"{'decode per token':40s} {hf['decode_ms_per_token']:.3f} ms  vs edgeocr "
                   f"{r.decode_ms_per_token:.3f} ms ({hf['decode_ms_per_token'] / r.decode_ms_per_token:.2f}x)")
        ours_total = r.total_ms - r.preprocess_ms
        out.append(f"{'total (from pixels)':40s} {hf['total_ms']:.0f} ms  vs edgeocr {ours_total:.0f} ms "
                   f"({hf['total_ms'] / ours_total:.2f}x)")
        if hf.get("peak_device_mib"):
            out.append(f"{'peak device memory (torch allocator)':40s} {hf['peak_device_mib']:.0f} MiB")
    return "\n".join(out)


def to_json(r: BenchResult, hf: dict | None = None) -> str:
    return json.dumps({"edgeocr": asdict(r), "transformers": hf, "pid": os.getpid()}, indent=2)


# ---------------------------------------------------------------------------------------------- many pages
def synthetic_page(seed: int = 0, size: tuple[int, int] = (1400, 1000)):
    """A deterministic page with text-like blocks, HxWx3 uint8 (no files needed)."""
    rng = np.random.default_rng(seed)
    h, w = size
    img = np.full((h, w, 3), 250, np.uint8)
    for y in range(80, h - 100, 38):
        x = 60
        while x < w - 100:
            bw = int(rng.integers(20, 90))
            img[y:y + 18, x:x + bw] = 30
            x += bw + int(rng.integers(8, 20))
    return img


def bench_pages(artifact: str | Path, images: list, device: str = "cpu", tokens: int = 64, task: str = "spotting",
                threads: int | None = None, cuda_graph: bool | None = None, preprocess: str | None = None,
                vision_ahead: bool | None = None) -> dict:
    """Continuous batching over the artifact's slots: every page generates exactly `tokens` tokens.
    Reports pages/s and tokens/s end to end (vision + prefill of each page included), and the decode step
    time with every slot busy.  vision_ahead: as OCRModel.scheduler (None: EDGEOCR_VISION_AHEAD); with it, a step's
    time includes the prefills of the pages whose vision finished before it."""
    from edgeocr.model import OCRModel
    from edgeocr.slots import drive

    preprocess = preprocess or default_preprocess(device)
    model = OCRModel(artifact, device=device, threads=threads, cuda_graph=cuda_graph, preprocess=preprocess,
                     vision_ahead=vision_ahead)
    opts = DecodeOptions(max_new_tokens=tokens, ignore_stop=True, tail_repetition_stop=False)
    model.recognize(images[0], task=task, options=DecodeOptions(max_new_tokens=4, ignore_stop=True))   # warm-up
    sched = _Timed(model.scheduler(vision_ahead=vision_ahead))
    cuda = None
    if device == "cuda":
        from edgeocr.backends import cudart
        cuda = cudart.load()
    done, peak_dev, vision, prefill, letterbox = 0, None, [], [], []
    t0 = time.perf_counter()
    for events in drive(sched, model.pages(images, task=task, options=opts)):   # preparation overlaps decoding
        for ev in events:
            if ev.result is not None:
                done += 1
                vision.append(ev.result.timings_ms["vision"])
                prefill.append(ev.result.timings_ms["prefill"])
                letterbox.append(ev.result.timings_ms.get("letterbox", 0.0))
        if cuda is not None and len(sched.steps) % 64 == 1:
            free, total = cuda.mem_info()
            peak_dev = max(peak_dev or 0.0, (total - free) / 2**20)
    full_steps, steps, admit_ms = sched.full_steps, sched.steps, sched.admit_ms
    wall = time.perf_counter() - t0
    m = model.artifact
    return {"backend": model.session.name, "precision": m.precision, "slots": m.slots,
            "flavour": f"attention {m.decoder.attention}, selection {'in graph' if m.decoder.select_on_device else 'host'}, "
                       f"CUDA graph {'on' if step_graph(model.session) else 'off'}{replay_label(model.session)}",
            "device_name": _gpu_name() if device == "cuda" else "cpu", "pages": done, "new_tokens_per_page": tokens,
            "wall_s": wall, "pages_per_s": done / wall, "tokens_per_s": done * tokens / wall,
            "step_ms_all_slots_busy": statistics.mean(full_steps) if full_steps else None,
            "step_ms_mean": statistics.mean(steps), "admit_ms_mean": statistics.mean(admit_ms),
            "vision_ahead": sched.sched.vision_ahead,
            "stream_priorities": bool(getattr(model.session, "stream_priorities", False)),
            "prefill_beside": sched.sched.prefill_beside,
            "vision_ms_mean": statistics.mean(vision),
            "prefill_ms_mean": statistics.mean(prefill),
            "letterbox_ms_mean": statistics.mean(letterbox),       # the device path's letterbox at admission
            "kv_cache_mib": m.kv.bytes / 2**20, "kv_mib_per_slot": m.kv.bytes / m.slots / 2**20,
            "peak_device_mib": peak_dev}


class _Timed:
    """A SlotScheduler whose admissions and steps are timed (ms), for bench_pages."""

    def __init__(self, sched):
        self.sched, self.slots = sched, sched.slots
        self.free, self.idle, self.live, self.cancel = sched.free, sched.idle, sched.live, sched.cancel
        self.failed = sched.failed                  # the same list: drive() reads and empties it
        self.admit_ms: list[float] = []
        self.steps: list[float] = []
        self.full_steps: list[float] = []           # steps with every slot busy

    def admit(self, page, tag) -> None:
        t0 = time.perf_counter()
        self.sched.admit(page, tag)
        self.admit_ms.append((time.perf_counter() - t0) * 1e3)

    def step(self):
        busy = self.sched.decoding()
        t0 = time.perf_counter()
        events = self.sched.step()
        dt = (time.perf_counter() - t0) * 1e3
        self.steps.append(dt)
        if busy == self.slots:
            self.full_steps.append(dt)
        return events


def _letterbox_part(r: dict) -> str:
    lb = r.get("letterbox_ms_mean")
    return f"device letterbox {lb:.1f} ms, " if lb else ""


def format_pages(r: dict, hf: dict | None = None) -> str:
    busy = r["step_ms_all_slots_busy"]
    lines = [f"{r['backend']} {r['precision']}, {r['slots']} slot(s), {r['flavour']}",
             f"{r['pages']} pages x {r['new_tokens_per_page']} tokens in {r['wall_s']:.2f} s: "
             f"{r['pages_per_s']:.2f} pages/s, {r['tokens_per_s']:.0f} tokens/s",
             (f"decode step with all slots busy {busy:.3f} ms" if busy else "decode step: slots never all busy")
             + f" (mean over all steps {r['step_ms_mean']:.3f} ms)",
             f"per page: {_letterbox_part(r)}vision {r['vision_ms_mean']:.1f} ms "
             f"({'on the worker thread while the other slots decode' if r['vision_ahead'] else 'the other slots wait'}"
             f"{', vision stream low priority, decoder high' if r.get('stream_priorities') else ''}), "
             f"prefill {r['prefill_ms_mean']:.1f} ms "
             f"({'beside the step, on the worker' if r.get('prefill_beside') else 'the other slots wait'}); "
             f"KV cache {r['kv_cache_mib']:.0f} MiB "
             f"({r['kv_mib_per_slot']:.0f} MiB per slot)"]
    if hf:
        lines.append(f"transformers generate ({hf['dtype']}, {hf['attn']}, batch {hf['batch']}): "
                     f"{hf['pages_per_s']:.2f} pages/s -> edgeocr {r['pages_per_s'] / hf['pages_per_s']:.2f}x")
    return "\n".join(lines)
