"""TensorRT engine helpers: `edgeocr build-engines ARTIFACT` (ONNX artifact -> TensorRT engines, on the target
device), loading TensorRT, deserializing engines and checking they fit this machine.  The session that runs
them is edgeocr.backends.tensorrt.

Two flavours share this code: full TensorRT (`tensorrt`, JetPack 6 ships 10.3; x86 wheels from NVIDIA)
and TensorRT-RTX (`tensorrt_rtx`, pip-installable, RTX GPUs).  Networks are strongly typed, so the
precision is the ONNX graph's own: an FP16 artifact gives FP16 engines, an INT8 artifact's explicit
Q/DQ gives INT8 layers (no implicit-INT8 calibrator: deprecated in 10.1, gone in 11).  Profiles: one
static profile for vision; two for the decoder, batch 1 (prefill: S in [1, prefill_len], the image rows
present; decode: S = 1 with a one-row image placeholder).  A timing cache persists beside the engines;
progress goes through IProgressMonitor; what the builder reports (layers, sizes, time) is saved.

Engines are tied to the TensorRT version and the GPU: `engines.json` records both, and
`check_compatible` refuses a mismatch at load with a message that says to rebuild.
TensorRT-RTX builds ahead of time without a GPU (engines are specialized when first loaded on an RTX
card), which is how CI builds real engines on a CPU-only machine.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from edgeocr.errors import BackendError
from edgeocr import artifact as af

ENGINES_FILE = "engines.json"
FLAVOURS = ("tensorrt", "tensorrt_rtx")


def import_trt(flavour: str = "auto"):
    """(module, flavour name): full TensorRT first, then TensorRT-RTX, unless one is asked for."""
    order = FLAVOURS if flavour == "auto" else (flavour,)
    if flavour not in ("auto", *FLAVOURS):
        raise BackendError(f"unknown TensorRT flavour {flavour!r}; use one of: auto, {', '.join(FLAVOURS)}")
    errors = []
    for name in order:
        try:
            return __import__(name), name
        except Exception as e:          # ImportError, or a library that fails to load
            errors.append(f"{name}: {e}")
    raise BackendError("no TensorRT found (" + "; ".join(errors) + "). On Jetson it comes with JetPack "
                       "(make the venv with --system-site-packages); on RTX cards: pip install "
                       "'tensorrt_rtx_cu13' (or tensorrt_rtx_cu12 for CUDA 12 drivers)")


def make_logger(trt):
    """A TensorRT logger that prints warnings and errors (as trt.Logger(WARNING) does) and keeps the errors,
    so a refusal (e.g. TensorRT-RTX on a GPU it does not support) can be reported in TensorRT's own words."""
    import sys

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg):
            level = int(severity)
            if level <= int(trt.ILogger.Severity.WARNING):
                print(f"[TRT] {msg}", file=sys.stderr, flush=True)
            if level <= int(trt.ILogger.Severity.ERROR):
                self.errors.append(str(msg))

    return Logger()


def deserialize(runtime, logger, blob: bytes):
    """(engine, None), or (None, why) in TensorRT's own words when the engine does not load here
    (`runtime` made with `logger`, a make_logger logger; keep the runtime alive as long as the engine)."""
    n = len(logger.errors)
    engine = runtime.deserialize_cuda_engine(blob)
    if engine is not None:
        return engine, None
    new = logger.errors[n:]
    return None, (new[0][:400] if new else "no reason given")


@dataclass(frozen=True)
class BuildOptions:
    flavour: str = "auto"                 # auto | tensorrt | tensorrt_rtx
    opt_level: int = 3                    # builder optimization level 0..5
    workspace_mib: int = 2048             # tactic scratch memory limit
    timing_cache: bool = True             # load/save OUT/timing.cache


def _gpu() -> dict:
    """Name and compute capability of GPU 0, or {} when there is none (ahead-of-time build)."""
    try:
        from edgeocr.backends import cudart
        return cudart.load().device_info()
    except Exception:
        return {}


def profiles(art: af.Artifact, graph: str) -> list[dict[str, tuple[tuple, tuple, tuple]]]:
    """Optimization profiles: input name -> (min, opt, max) shapes.  One sequence (batch 1): the TensorRT
    session decodes one page at a time."""
    g = getattr(art, graph)
    if graph == "vision":
        return [{t["name"]: (tuple(t["shape"]),) * 3 for t in g.inputs}]
    kv, d, hidden = art.kv, art.kv.head_dim, art.hidden_size
    n_img, max_s = art.image.n_image_tokens, g.prefill_len
    opt_s = min(max_s, n_img + 32)
    common = {"past_len": ((1,),) * 3, "seen": ((1, art.vocab_size),) * 3, "penalty": ((1,),) * 3,
              **{f"past_{k}_{i}": ((1, *kv.shape[1:]),) * 3 for k in ("key", "value") for i in range(kv.layers)}}
    prefill = {**common, "input_ids": ((1, 1), (1, opt_s), (1, max_s)),
               "image_embeds": ((1, hidden), (n_img, hidden), (n_img, hidden)),
               "cos": ((1, 1, d), (1, opt_s, d), (1, max_s, d)), "sin": ((1, 1, d), (1, opt_s, d), (1, max_s, d))}
    decode = {**common, "input_ids": ((1, 1),) * 3, "image_embeds": ((1, hidden),) * 3,
              "cos": ((1, 1, d),) * 3, "sin": ((1, 1, d),) * 3}
    names = {t["name"] for t in g.inputs}
    return [{k: v for k, v in p.items() if k in names} for p in (prefill, decode)]


def _progress_monitor(trt, say):
    class Monitor(trt.IProgressMonitor):
        def __init__(self):
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, parent_phase, phase_name, num_steps):
            if parent_phase is None:        # top-level phases only; nested ones repeat per layer
                say(f"  {phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name, step):
            return True          # never cancel

        def phase_finish(self, phase_name):
            pass

    return Monitor()


def build_graph(trt, onnx_path: Path, engine_path: Path, profiles, opts: BuildOptions, cache_path: Path | None,
                say) -> dict:
    logger = make_logger(trt)
    builder = trt.Builder(logger)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    net = builder.create_network(flags)
    parser = trt.OnnxParser(net, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errs = "; ".join(parser.get_error(i).desc() for i in range(parser.num_errors))
        raise BackendError(f"TensorRT could not parse {onnx_path.name}: {errs}")
    cfg = builder.create_builder_config()
    cfg.builder_optimization_level = opts.opt_level
    cfg.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, opts.workspace_mib << 20)
    cfg.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    cfg.progress_monitor = _progress_monitor(trt, say)
    cache = None
    if cache_path is not None and hasattr(cfg, "create_timing_cache"):
        blob = cache_path.read_bytes() if cache_path.exists() else b""
        cache = cfg.create_timing_cache(blob)
        cfg.set_timing_cache(cache, ignore_mismatch=False)
    names = {net.get_input(i).name for i in range(net.num_inputs)}
    for prof in profiles:
        p = builder.create_optimization_profile()
        for name in names:
            if name not in prof:
                raise BackendError(f"{onnx_path.name}: no profile shape for input {name!r}")
            p.set_shape(name, *prof[name])
        cfg.add_optimization_profile(p)
    layer_types: dict[str, int] = {}
    for i in range(net.num_layers):
        t = str(net.get_layer(i).type).split(".")[-1]
        layer_types[t] = layer_types.get(t, 0) + 1
    t0 = time.perf_counter()
    blob = builder.build_serialized_network(net, cfg)
    if blob is None:
        raise BackendError(f"TensorRT failed to build an engine for {onnx_path.name} (see the log above)")
    seconds = time.perf_counter() - t0
    tmp = engine_path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(memoryview(blob))
    os.replace(tmp, engine_path)
    if cache is not None:
        cache_path.write_bytes(memoryview(cfg.get_timing_cache().serialize()))
    return {"file": engine_path.name, "bytes": engine_path.stat().st_size, "build_seconds": round(seconds, 2),
            "engine_layers": _inspect(trt, logger, engine_path), "network_layers": net.num_layers, "network_layer_types": dict(sorted(layer_types.items())),
            "qdq_layers": layer_types.get("QUANTIZE", 0) + layer_types.get("DEQUANTIZE", 0),
            "profiles": [{k: [list(s) for s in v] for k, v in prof.items() if k in ("input_ids", "image_embeds")}
                         for prof in profiles]}


def _inspect(trt, logger, engine_path: Path) -> dict:
    """The engine's own layer list (what ran where, fused or not), saved beside it; needs a GPU that the
    engine can load on, so an ahead-of-time build records why it is missing."""
    try:
        runtime = trt.Runtime(logger)
        engine, why = deserialize(runtime, logger, engine_path.read_bytes())
        if engine is None:
            return {"available": False, "reason": f"the engine does not load on this machine: {why}"}
        insp = engine.create_engine_inspector()
        info = json.loads(insp.get_engine_information(trt.LayerInformationFormat.JSON))
        out = engine_path.with_suffix(".layers.json")
        out.write_text(json.dumps(info, indent=1))
        names = [x.get("Name", "") if isinstance(x, dict) else str(x) for x in info.get("Layers", [])]
        return {"available": True, "file": out.name, "count": len(names),
                "attention_fused": any("mha" in n.lower() or "attention" in n.lower() for n in names)}
    except Exception as e:      # no GPU, or a GPU the flavour cannot run on
        return {"available": False, "reason": str(e).splitlines()[0][:200]}


def build(artifact: str | Path, opts: BuildOptions = BuildOptions(), progress=print) -> dict:
    """Build vision and decoder engines into the artifact directory; returns the engines record."""
    art = Path(artifact)
    m = af.read(art)
    if m.decoder.attention != "masked":
        raise BackendError("this artifact's decoder uses ONNX Runtime's GroupQueryAttention, which TensorRT "
                           "cannot parse: export it with --attention masked (the default) for TensorRT")
    trt, flavour = import_trt(opts.flavour)
    gpu = _gpu()
    progress(f"{flavour} {trt.__version__}; GPU: {gpu.get('name', 'none (ahead-of-time build)')}")
    cache = art / "timing.cache" if opts.timing_cache and gpu else None   # timing needs a GPU
    record = {"flavour": flavour, "tensorrt_version": trt.__version__, "gpu": gpu, "precision": m.precision,
              "engines": {}}
    for graph in ("vision", "decoder"):
        progress(f"building {graph} engine from {getattr(m, graph).file}")
        info = build_graph(trt, art / getattr(m, graph).file, art / f"{graph}.engine", profiles(m, graph),
                           opts, cache, progress)
        progress(f"{graph}: {info['bytes'] / 2**20:.1f} MiB engine in {info['build_seconds']:.1f} s "
                 f"({info['network_layers']} network layers, {info['qdq_layers']} Q/DQ)")
        record["engines"][graph] = info
    tmp = art / (ENGINES_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, art / ENGINES_FILE)
    return record


def check_compatible(record: dict, trt_version: str, gpu: dict) -> None:
    """Refuse engines built by another TensorRT or for another GPU, saying how to fix it."""
    built = record.get("tensorrt_version")
    if built != trt_version:
        raise BackendError(f"these engines were built with {record.get('flavour', 'TensorRT')} {built}, this "
                           f"machine has {trt_version}: rebuild them here with `edgeocr build-engines ARTIFACT`")
    bg = record.get("gpu") or {}
    if bg and gpu and (bg.get("name"), bg.get("compute_capability")) != (gpu.get("name"), gpu.get("compute_capability")):
        raise BackendError(f"these engines were built for {bg.get('name')} (compute capability "
                           f"{bg.get('compute_capability')}), this GPU is {gpu.get('name')} "
                           f"({gpu.get('compute_capability')}): rebuild them here with `edgeocr build-engines ARTIFACT`")
