"""scripts/gpu_perf.py's pieces that run without a GPU: the GroupQueryAttention probe's own bookkeeping (output
binding order, its numpy reference) on the CPU provider, and the arena settings of `memory --config tuned`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]


def _gpu_perf():
    spec = importlib.util.spec_from_file_location("gpu_perf", ROOT / "scripts" / "gpu_perf.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_perf"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_gqa_probe_reads_the_attention_output():
    """The probe binds three outputs; it compares the attention output (not the first cache it bound, which
    failed with `cannot reshape array of size 8192 into shape (6,4,64)`) with its numpy reference.  The CPU
    provider has no Q/K-norm prologue, so this runs the probe without the norm inputs."""
    r = _gpu_perf().probe_gqa_qk_norm(["CPUExecutionProvider"], "cpu", qk_norm=False)
    assert r["ok"] and r["max_err"] < 3e-2 and r["cache_err"] == 0.0, r


def test_probe_has_no_swiglu():
    """ONNX Runtime 1.31's CUDA provider registers no SwiGLU kernel; fuse no longer emits it, so the probe does
    not ask for it and never prints --no-swiglu (quantize fuse has no such flag any more)."""
    src = (ROOT / "scripts" / "gpu_perf.py").read_text()
    assert "SwiGLU" not in src and "--no-swiglu" not in src


def test_tuned_memory_keeps_the_cuda_graph_arena():
    """`memory --config tuned`: with a decoder that replays a CUDA graph the arena is not shared with the vision
    session whose calls shrink it (the captured step's buffers would be freed under it)."""
    tuned = _gpu_perf().tuned_arena
    graph = SimpleNamespace(decoder=SimpleNamespace(attention="gqa", select_on_device=True))
    plain = SimpleNamespace(decoder=SimpleNamespace(attention="masked", select_on_device=False))
    share, shrink, _ = tuned(graph, "tuned", "cuda")
    assert shrink and not share
    assert tuned(plain, "tuned", "cuda")[:2] == (True, True)
    assert tuned(graph, "runtime", "cuda")[:2] == (False, False) and tuned(graph, "tuned", "cpu")[:2] == (False, False)
