"""`edgeocr doctor`: what this machine can run, and whether the artifact and the daemon are usable."""

from __future__ import annotations

import importlib
import json
import platform
import shutil
import subprocess
import sys


def _line(ok: bool | None, what: str, detail: str) -> None:
    mark = {True: "ok  ", False: "FAIL", None: "--  "}[ok]
    print(f"[{mark}] {what:22s} {detail}")


def doctor(artifact: str | None, remote: str | None) -> int:
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
            if m.precision == "fp16" and "CUDAExecutionProvider" not in provs:
                _line(None, "artifact/device", "FP16 artifact without CUDA: it runs on CPU, slowly")
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
