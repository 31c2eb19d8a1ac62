"""ONNX Runtime settings: CUDA ones that keep device memory to what the model needs, and the CPU's threads.

The CUDA execution provider's defaults are made for throughput on a large GPU: cuDNN may take the largest
workspace it wants for each convolution (and searches every algorithm with it), and each session keeps its
own memory arena at its peak.  Here the vision graph's activations (4,096 patches) are the peak and they are
needed once per page, while the decoder runs for hundreds of steps after them.  These functions give the
settings the runtime's ONNX Runtime session uses on CUDA; docs/perf.md has the measured breakdown.

- `cuda_provider_options`: arena grown by what is asked (not in powers of two), heuristic cuDNN algorithm
  choice without the maximal workspace, TF32 off for FP32 artifacts (exact FP32 numerics).
- `share_arena`: one arena for the vision and decoder sessions (what the vision graph freed serves the
  prefill), instead of two that each keep their peak.
- `vision_run_options`: return the arena's free chunks to the device after each vision call (the runtime's
  default on CUDA, `vision_shrink_wanted`).
- `prefill_graph_wanted`, `vision_graph_wanted`: replay the prefill (one CUDA graph per slot and prompt length)
  and the vision graph as ONNX Runtime CUDA graphs instead of launching their ~350 and ~270 kernels one by one.
- `cuda_stack_bytes`: the per-thread stack the CUDA context reserves local memory for (0 by default: what the
  kernels need, grown by the driver; its own default is 1 KiB for every thread the GPU can hold at once).
"""

from __future__ import annotations

import os

CPU_SPIN_ENV = "EDGEOCR_CPU_SPIN"    # "1": let ONNX Runtime's CPU worker threads spin between kernels
STREAM_PRIORITIES_ENV = "EDGEOCR_STREAM_PRIORITIES"   # "1": decoder on a high-priority CUDA stream, vision low
VISION_ARENA_ENV = "EDGEOCR_VISION_ARENA"            # "shrink" (default without the vision graph) | "keep"
CUDA_ARENA_ENV = "EDGEOCR_CUDA_ARENA"                # "separate" (default) | "shared": the sessions' CUDA arenas
MEM_PATTERN_ENV = "EDGEOCR_MEM_PATTERN"              # "1" | "0": ONNX Runtime's memory patterns (memory_patterns)
PREFILL_GRAPH_ENV = "EDGEOCR_PREFILL_GRAPH"          # 1 | 0: a CUDA graph per prompt length's prefill
VISION_GRAPH_ENV = "EDGEOCR_VISION_GRAPH"            # 1 | 0: the vision graph replayed as a CUDA graph
VISION_AHEAD_ENV = "EDGEOCR_VISION_AHEAD"            # "1": schedulers run vision ahead unless told otherwise
CUDA_STACK_ENV = "EDGEOCR_CUDA_STACK"                # bytes of stack per GPU thread the CUDA context reserves


def cpu_session_config() -> dict:
    """Session config entries for ONNX Runtime's CPU provider.  The intra-op worker threads do not spin-wait
    between kernels: a decode step runs ~1,000 small kernels, and on cores shared with anything else (the
    daemon's own threads, preprocessing, other processes) spinning workers take the cores the next kernel
    needs.  Measured on a shared 2-core x86 machine (real-size 8-bit CPU artifact, 2 threads, 2026-12-04):
    102 -> 51-58 ms per token.  EDGEOCR_CPU_SPIN=1 restores ONNX Runtime's default (for dedicated cores)."""
    if os.environ.get(CPU_SPIN_ENV) == "1":
        return {}
    return {"session.intra_op.allow_spinning": "0"}


def cuda_provider_options(precision: str, device_id: int = 0, conv_workspace: bool = False) -> dict:
    """CUDAExecutionProvider options for an artifact of `precision` ("fp32", "fp16", "int8-weights", ...)."""
    opts = {"device_id": device_id,
            "use_tf32": 0 if precision == "fp32" else 1,           # TF32 would change FP32 results by ~1e-3
            "arena_extend_strategy": "kSameAsRequested"}           # grow by the request, not to the next power of 2
    if not conv_workspace:
        opts.update({"cudnn_conv_algo_search": "HEURISTIC",       # no trial of every algorithm at load
                     "cudnn_conv_use_max_workspace": "0"})         # no GB-sized workspace for the patch convs
    return opts


def share_arena(ort, session_options, device_id: int = 0) -> None:
    """Register one CUDA arena with ONNX Runtime's environment (once per process) and make the sessions created
    with `session_options` allocate from it."""
    if not getattr(share_arena, "_registered", False):
        mem = ort.OrtMemoryInfo("Cuda", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, device_id, ort.OrtMemType.DEFAULT)
        arena = ort.OrtArenaCfg({"arena_extend_strategy": 1})               # kSameAsRequested
        ort.create_and_register_allocator_v2("CUDAExecutionProvider", mem, {"device_id": str(device_id)}, arena)
        share_arena._registered = True
    session_options.add_session_config_entry("session.use_env_allocators", "1")


def vision_run_options(ort, device_id: int = 0):
    """RunOptions for the vision graph: after the call, the arena hands its unused chunks back to the device."""
    ro = ort.RunOptions()
    ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", f"gpu:{device_id}")
    return ro


def vision_shrink_wanted() -> bool:
    """Whether the vision session hands its arena's free chunks back to the device after each call on CUDA
    (EDGEOCR_VISION_ARENA: "shrink", the default, or "keep").  The vision graph's activations (4,096 patches)
    are the runtime's peak and are needed once a page; kept, they stay reserved while the decoder runs.
    Measured on an H100 (real-size architecture, native step, two pages of 256 tokens, 2026-12-05): 3,801 ->
    3,413 MiB FP16, 3,083 -> 2,687 MiB 8-bit (docs/perf.md)."""
    value = os.environ.get(VISION_ARENA_ENV, "shrink").strip().lower()
    if value not in ("shrink", "keep"):
        raise ValueError(f"{VISION_ARENA_ENV} must be 'shrink' or 'keep', not {value!r}")
    return value == "shrink"


def stream_priorities_wanted(value: bool | None = None) -> bool:
    """Whether the CUDA sessions run on prioritized streams (None: EDGEOCR_STREAM_PRIORITIES, off when unset)."""
    if value is None:
        return os.environ.get(STREAM_PRIORITIES_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def priority_stream_options(cuda) -> tuple[dict, dict]:
    """Provider options putting the vision session on a lowest-priority CUDA stream and the decoder session
    (prefill and the decode step) on a highest-priority one, as ({vision}, {decoder}).  `cuda`: an
    edgeocr.backends.cudart.CudaRT.  With vision ahead (edgeocr.slots) a page's vision runs beside the decode
    steps of the other slots; the GPU then hands freed multiprocessors to the step's small kernels before the
    vision's large ones, instead of letting the vision's kernels fill the device while a step waits.  The streams
    live as long as the process (one pair per session)."""
    lowest, highest = cuda.stream_priority_range()
    vision, decoder = cuda.stream_create_with_priority(lowest), cuda.stream_create_with_priority(highest)
    return {"user_compute_stream": str(vision)}, {"user_compute_stream": str(decoder)}


def _choice(env: str, default: str, allowed: tuple[str, ...]) -> str:
    value = os.environ.get(env, default).strip().lower() or default
    if value not in allowed:
        raise ValueError(f"{env} must be one of {', '.join(repr(a) for a in allowed)}, not {value!r}")
    return value


def shared_arena_wanted() -> bool:
    """Whether the vision and decoder sessions draw from one CUDA arena (EDGEOCR_CUDA_ARENA: "separate", the
    default, or "shared"): what the vision graph's activations freed then serves the prefill's, so the pair
    holds the larger of the two peaks instead of both.  Only where the decoder does not replay an ONNX Runtime
    CUDA graph (a captured step keeps addresses in the arena; edgeocr's native step has buffers of its own)."""
    return _choice(CUDA_ARENA_ENV, "separate", ("separate", "shared")) == "shared"


def mem_pattern_wanted() -> bool | None:
    """Whether ONNX Runtime plans each run's activations as one block after the first run of a shape
    (EDGEOCR_MEM_PATTERN: "1" or "0"; None when unset: `memory_patterns` decides, per session).
    Off, each activation is its own chunk of the arena, which the next run reuses chunk by chunk instead of asking
    for one more block the size of the whole plan."""
    if os.environ.get(MEM_PATTERN_ENV, "").strip() == "":
        return None
    return _choice(MEM_PATTERN_ENV, "", ("1", "0")) == "1"


def _flag(env: str) -> bool:
    value = os.environ.get(env, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{env} must be 1 or 0, not {value!r}")


def prefill_graph_wanted() -> bool | None:
    """Whether the decoder session replays each prefill as a CUDA graph (EDGEOCR_PREFILL_GRAPH: 1 | 0; None when
    unset: on for native-step artifacts, where it was measured, unless the arena is shared; 1 also takes the other
    artifacts with GroupQueryAttention and in-graph selection, except those with device-resident step state).  One
    graph per slot and prompt length, captured on its third run on a thread (ONNX Runtime runs a graph id twice
    before it captures it, and keeps its graphs per thread); the prompt's ids and RoPE tables are written into the
    same device buffers (once for pages of the same instruction).  With them the decoder session runs without
    memory patterns (a replayed prefill needs no plan).  Measured on an H100 (2026-12-06, docs/perf.md section 16):
    prefill 7.0 -> 6.1 ms; 72 MiB less device memory after two pages, 164 MiB less with memory patterns off for
    both sessions."""
    if os.environ.get(PREFILL_GRAPH_ENV, "").strip() == "":
        return None
    return _flag(PREFILL_GRAPH_ENV)


def vision_graph_wanted() -> bool | None:
    """Whether the vision session replays the vision graph as a CUDA graph (EDGEOCR_VISION_GRAPH: 1 | 0; None when
    unset: on for native-step artifacts with 8-bit vision weights, unless EDGEOCR_VISION_AHEAD=1 asks for visions on
    a worker thread; vision_graph_default).  The page is copied into one device buffer and the embeddings out of
    one, so a single graph serves every slot; its activations stay reserved in the vision arena (no shrink after
    each call), planned without memory patterns unless EDGEOCR_MEM_PATTERN=1.  Measured on an H100 (2026-12-06,
    docs/perf.md section 18): vision 18.6-19.0 -> 15.8 ms (FP16); device memory after two pages +210 MiB (FP16:
    3,204.8, over its 3,072 MiB target, hence off with FP16 vision weights) and +218 MiB (8-bit: 2,366.8 MiB, under
    its 2,560)."""
    if os.environ.get(VISION_GRAPH_ENV, "").strip() == "":
        return None                   # vision_graph_default decides
    return _flag(VISION_GRAPH_ENV)


def vision_graph_default(vision_weights: str | None, vision_ahead: bool | None = None) -> bool:
    """EDGEOCR_VISION_GRAPH unset: replay the vision graph as a CUDA graph for native-step artifacts whose vision
    weights are 8-bit (`vision_weights`: native_vision_weights; `native-step --weights int8`, or `--vision int8`
    beside FP16 decoder weights), where its kept arena fits the memory targets (FP16 weights with the vision graph
    took 3,204.8 MiB on an H100, over 3,072; FP16 decoder and 8-bit vision weights 2,812.8: docs/perf.md sections
    18-19), unless the arena is shared (EDGEOCR_CUDA_ARENA=shared), shrunk after each call
    (EDGEOCR_VISION_ARENA=shrink) or the model's schedulers run visions ahead on a worker thread (`vision_ahead`;
    None: EDGEOCR_VISION_AHEAD=1; ONNX Runtime keeps its CUDA graphs per thread)."""
    shrink_asked = os.environ.get(VISION_ARENA_ENV, "").strip().lower() == "shrink"
    ahead = vision_ahead_asked() if vision_ahead is None else bool(vision_ahead)
    return vision_weights == "int8" and not shared_arena_wanted() and not ahead and not shrink_asked


def native_vision_weights(art) -> str | None:
    """"int8" / "float": the vision weights `quantize native-step` left in an artifact (its report in the manifest's
    export section); None for an artifact it did not make."""
    if not art.decoder.native_step:
        return None
    return ((art.export or {}).get("native_step") or {}).get("vision", {}).get("weights")


def memory_patterns(pattern: bool | None, vision_graph: bool, prefill_graph: bool) -> tuple[bool, bool]:
    """(vision, decoder) session memory patterns for `pattern` = mem_pattern_wanted().  Unset: on, except for a
    replayed vision graph, which keeps what its capture used: planned tensor by tensor that is 210 MiB at the real
    size against 366 MiB for a block of the whole plan after per-tensor first runs (docs/perf.md section 18).  The
    decoder's are off whenever its prefills are replayed: they need no plan, and with patterns each prompt
    length's first runs ask for one more block the size of its whole plan (92 MiB), kept by the decoder's arena."""
    vision = pattern if pattern is not None else not vision_graph
    decoder = False if prefill_graph else (pattern if pattern is not None else True)
    return vision, decoder


def vision_ahead_asked() -> bool:
    """EDGEOCR_VISION_AHEAD=1: schedulers run each page's vision on a worker thread unless told otherwise
    (edgeocr.slots)."""
    return os.environ.get(VISION_AHEAD_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def cuda_stack_bytes() -> int | None:
    """The per-thread stack size set on the CUDA context at load (EDGEOCR_CUDA_STACK, bytes; default 0), or None
    ("driver") to keep the driver's.  The context reserves local memory for that stack times every thread the GPU
    can hold at once: 264 MiB at the driver's default 1 KiB on a 132-SM H100.  The driver grows the limit for any
    kernel that needs more (and keeps it), so 0 reserves what the kernels launched need: 80 bytes a thread for
    the native-step artifacts, 21 MiB on that GPU (measured 2026-12-06, docs/perf.md)."""
    value = os.environ.get(CUDA_STACK_ENV, "").strip().lower()
    if value == "":
        return 0
    if value == "driver":
        return None
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{CUDA_STACK_ENV} must be a number of bytes (>= 0) or 'driver', not {value!r}")
    return n
