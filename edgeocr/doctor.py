"""`edgeocr doctor`: what this machine can run, and whether the artifact and the daemon are usable."""

from __future__ import annotations

import importlib
import json
import platform
import shutil
import subprocess
import sys


def _line(ok: bool | str | None, what: str, detail: str) -> None:
    mark = {True: "ok  ", False: "FAIL", None: "--  ", "warn": "WARN"}[ok]
    print(f"[{mark}] {what:22s} {detail}")


def load_problem(art, device: str) -> str | None:
    """Why `art` cannot load with ONNX Runtime on `device` at all (a failure, not a poor fit), or None."""
    from edgeocr.artifact import cuda_only_problem

    if device == "cpu" and (why := cuda_only_problem(art)):
        return why
    if art.decoder.native_step:
        if art.decoder.step_state:
            return "native-step weights with a step-state decoder: no session runs both; rebuild one of them"
        from edgeocr.backends.native_step import spec_problem
        why = spec_problem(art)
        if why:
            return why
    return None


def native_step_engine(art, device: str) -> str:
    """Which decode step a native-step artifact gets on `device`, and why (edgeocr.backends.native_step)."""
    import numpy as np

    from edgeocr.backends.native_step import Dims, cuda_problem, native_mode
    from edgeocr.errors import BackendError
    try:
        mode = native_mode()
    except BackendError as e:
        return str(e)
    if mode == "off":
        return "ONNX Runtime's (EDGEOCR_NATIVE_STEP=0)"
    if mode == "numpy":
        return "the native step's numpy twins (EDGEOCR_NATIVE_STEP=numpy)"
    if device != "cuda":
        return "ONNX Runtime's (the native step runs on CUDA)"
    why = cuda_problem(Dims.of(art), art.slots, np.dtype(art.decoder.native_step["dtype"]))
    if why is None:
        try:
            from edgeocr.backends import nvrtc
            nvrtc._load_nvrtc()
        except BackendError as e:
            why = str(e)
    return f"ONNX Runtime's: {why}" if why else "native (edgeocr's kernels, compiled at load by NVRTC)"


def device_fit(art, device: str) -> list[str]:
    """Why `art` is a poor fit for ONNX Runtime on `device` ("cpu" | "cuda"), one sentence each; [] when it
    fits.  The figures are the measured ones in docs/int8.md (which artifact on which device)."""
    w8 = art.export.get("weight_int8") or {}
    acts = w8.get("activations", art.precision)
    cpu_fix = "for the CPU build `python -m quantize weight-int8 FP32_ARTIFACT OUT --target cpu`"
    out = []
    if device == "cpu":
        if art.precision == "int8":
            out.append("calibrated INT8 (Q/DQ) is made for TensorRT; ONNX Runtime's CPU provider runs it several "
                       f"times slower per token than FP32 (demo model, docs/int8.md: 3.23 vs 0.66 ms); {cpu_fix}")
        if w8 and w8.get("accuracy_level", 0) != 4:
            out.append("its MatMulNBits weights are dequantized to floating point on every call on the CPU "
                       f"(accuracy_level {w8.get('accuracy_level', 0)}): about 4x slower per token than FP32; "
                       f"{cpu_fix}")
        if acts == "fp16":
            out.append("FP16 activations: ONNX Runtime's CPU provider computes them slowly; use an FP32-based artifact")
        if art.decoder.attention == "masked":
            out.append("masked decoder: every step attends over the whole static cache; export with "
                       "--attention gqa for attention over the live length only")
    elif device == "cuda":
        if art.precision == "int8":
            out.append("calibrated INT8 (Q/DQ) is made for TensorRT (`edgeocr build-engines`); ONNX Runtime's CUDA "
                       "provider runs its Q/DQ pairs as separate kernels, slower than FP16")
        if w8.get("target") == "cpu" or (art.precision != "int8" and acts == "fp32"):
            out.append("FP32 activations (a CPU build or the FP32 export): on a GPU use the FP16 artifact or "
                       "its `quantize weight-int8` (default target gpu)")
    return out


def verify_files(directory, files: dict) -> list[str]:
    """The artifact's files whose sha256 differs from the manifest's (changed, corrupted or replaced)."""
    import hashlib
    from pathlib import Path

    bad = []
    for name, meta in sorted(files.items()):
        h = hashlib.sha256()
        with open(Path(directory) / name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        if h.hexdigest() != meta.get("sha256"):
            bad.append(name)
    return bad


def doctor(artifact: str | None, remote: str | None, verify: bool = False) -> int:
    failures = 0
    _line(sys.version_info >= (3, 10), "python", f"{platform.python_version()} ({sys.executable})")
    try:
        ort = importlib.import_module("onnxruntime")
        provs = ort.get_available_providers()
        _line(True, "onnxruntime", f"{ort.__version__}; providers: {', '.join(provs)}")
    except ImportError:
        provs = []
        failures += 1
        _line(False, "onnxruntime", "not installed: pip install 'edgeocr[cpu]' or 'edgeocr[cuda]'")
    from edgeocr.errors import BackendError
    from edgeocr.preprocess import jpeg_decoder
    try:
        jpeg = jpeg_decoder()
        _line(True if jpeg == "simplejpeg" else None, "jpeg decoder",
              "simplejpeg (the device path: Pillow's pixels, one copy fewer)" if jpeg == "simplejpeg" else
              "Pillow (simplejpeg, in the [cuda] extra, takes 1-6 ms off the first token from a JPEG file: "
              "docs/perf.md sections 18 and 24)")
    except BackendError as e:
        failures += 1
        _line(False, "jpeg decoder", str(e))
    for mod in ("tensorrt", "tensorrt_rtx", "pycuda", "cuda"):
        try:
            m = importlib.import_module(mod)
            _line(True, mod, getattr(m, "__version__", "present"))
        except Exception:
            _line(None, mod, "not available")
    gpu = None
    if shutil.which("nvidia-smi"):
        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10).stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            gpu = None
    try:
        with open("/proc/device-tree/model") as f:
            tegra = f.read().strip("\0\n ")
        if "Jetson" in tegra or "Orin" in tegra:
            gpu = (gpu + "; " if gpu else "") + tegra
    except OSError:
        pass
    _line(None if gpu is None else True, "gpu", gpu or "none found (CPU only)")
    if artifact:
        from edgeocr.errors import EdgeOCRError
        from edgeocr import artifact as af
        try:
            m = af.read(artifact)
            total = sum(v["bytes"] for v in m.files.values())
            _line(True, "artifact", f"{artifact}: format {m.format_version}, {m.precision}, "
                                    f"{total / 2**20:.0f} MiB, KV cache {m.slots} x {m.cache_len} tokens")
            if provs:
                short = af.onnxruntime_shortfall(m, ort.__version__)
                req = af.onnxruntime_requirement(m)["onnxruntime"]
                if short:
                    failures += 1
                _line(not short, "artifact/onnxruntime", short or f"needs >= {req}, have {ort.__version__}")
            if verify:
                bad = verify_files(artifact, m.files)
                if bad:
                    failures += 1
                _line(not bad, "artifact/sha256", f"differs from the manifest: {', '.join(bad)}" if bad
                      else f"{len(m.files)} files match the manifest")
            device = "cuda" if "CUDAExecutionProvider" in provs and gpu else "cpu"
            problem, warnings = load_problem(m, device), device_fit(m, device)
            if problem:
                failures += 1
                _line(False, f"artifact on {device}", problem)
            for w in warnings:
                _line("warn", f"artifact on {device}", w)
            if not warnings and not problem:
                _line(True, f"artifact on {device}", "a good fit (docs/int8.md: which artifact on which device)")
            if m.decoder.native_step and not problem:
                _line(True, "decode step", native_step_engine(m, device))
        except EdgeOCRError as e:
            failures += 1
            _line(False, "artifact", str(e))
    if remote:
        from edgeocr.serve import client_request
        try:
            code, body = client_request(remote, "GET", "/health/ready", timeout=5)
            state = json.loads(body).get("status") if code == 200 else json.loads(body).get("error", {}).get("type")
            _line(code == 200, "daemon", f"{remote}: HTTP {code} ({state})")
        except (OSError, ValueError) as e:
            _line(None, "daemon", f"{remote}: not reachable ({e})")
    return 1 if failures else 0
