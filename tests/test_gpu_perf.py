"""scripts/gpu_perf.py's pieces that run without a GPU: the GroupQueryAttention probe's own bookkeeping (output
binding order, its numpy reference) on the CPU provider, and the arena settings of `memory --config tuned`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    """scripts/NAME.py as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_gqa_probe_reads_the_attention_output():
    """The probe binds three outputs; it compares the attention output (not the first cache it bound, which
    failed with `cannot reshape array of size 8192 into shape (6,4,64)`) with its numpy reference.  The CPU
    provider has no Q/K-norm prologue, so this runs the probe without the norm inputs."""
    r = _script("gpu_perf").probe_gqa_qk_norm(["CPUExecutionProvider"], "cpu", qk_norm=False)
    assert r["ok"] and r["max_err"] < 3e-2 and r["cache_err"] == 0.0, r


def test_probe_has_no_swiglu():
    """ONNX Runtime 1.31's CUDA provider registers no SwiGLU kernel; fuse no longer emits it, so the probe does
    not ask for it and never prints --no-swiglu (quantize fuse has no such flag any more)."""
    src = (ROOT / "scripts" / "gpu_perf.py").read_text()
    assert "SwiGLU" not in src and "--no-swiglu" not in src


def test_tuned_memory_keeps_the_cuda_graph_arena():
    """`memory --config tuned`: with a decoder that replays a CUDA graph the arena is not shared with the vision
    session whose calls shrink it (the captured step's buffers would be freed under it)."""
    tuned = _script("gpu_perf").tuned_arena
    graph = SimpleNamespace(decoder=SimpleNamespace(attention="gqa", select_on_device=True))
    plain = SimpleNamespace(decoder=SimpleNamespace(attention="masked", select_on_device=False))
    share, shrink, _ = tuned(graph, "tuned", "cuda")
    assert shrink and not share
    assert tuned(plain, "tuned", "cuda")[:2] == (True, True)
    assert tuned(graph, "runtime", "cuda")[:2] == (False, False) and tuned(graph, "tuned", "cpu")[:2] == (False, False)


def test_admission_timeline_names_the_gaps_and_the_host_calls_in_them():
    """`gpu_profile.py --admission`: busy time is the union of overlapping kernels (two streams), idle is the span
    less that, and a gap over GAP_US names the kernels around it and the host's CUDA calls made during it."""
    ks = [(0.0, 100.0, "vision_a"), (50.0, 120.0, "vision_b"),      # overlap: busy 120, not 170
          (120.0, 200.0, "vision_c"),
          (260.0, 300.0, "Memcpy DtoD"),                           # 60 us idle after vision_c
          (305.0, 400.0, "prefill")]                               # 5 us: under GAP_US, not named
    api = [(150.0, 210.0, "cudaStreamSynchronize"), (215.0, 230.0, "cudaMemcpy"), (232.0, 240.0, "cudaMemcpy"),
           (500.0, 510.0, "cudaGraphLaunch")]                       # outside every gap
    r = _script("gpu_profile")._admission({"from_pixels_ms": 0.5}, ks, api)
    assert r["gpu_span_ms"] == 0.4 and r["kernels"] == 5
    assert abs(r["gpu_busy_ms"] - 0.335) < 1e-9 and abs(r["gpu_idle_ms"] - 0.065) < 1e-9
    assert r["gaps"] == [{"us": 60.0, "after": "vision_c", "before": "Memcpy DtoD",
                          "host_calls": {"cudaMemcpy": 2, "cudaStreamSynchronize": 1}}]
    assert r["from_pixels_ms"] == 0.5


def test_rope_forms_compute_the_layout_b_rope():
    """scripts/gpu_rope_bench.py times ONNX formulations of the prefill's RoPE on the GPU; each must compute the
    same layout-B product (every dim its own angle, the value heads untouched) as numpy, or its timing means
    nothing.  Checked on the CPU provider at a small length, every copy's output."""
    import numpy as np

    rb = _script("gpu_rope_bench")
    s, heads, d = 6, 32, 128
    x = np.random.default_rng(3).standard_normal((1, s, heads, d)).astype(np.float16)
    cos, sin = rb.tables(s, heads, 24, d, seed=4)
    xf = x.astype(np.float32)
    assert np.array_equal(xf @ rb.rotate_half_matrix(d), np.concatenate([-xf[..., d // 2:], xf[..., :d // 2]], -1))
    want = rb.reference(x[0], cos, sin)[None]
    assert np.abs(want[:, :, 24:] - xf[:, :, 24:]).max() == 0       # the value heads pass through
    for form in rb.FORMS:
        sess = rb.session(form, s, heads, d, 3, cos, sin, ["CPUExecutionProvider"])
        for y in sess.run(None, {"x": x}):
            assert np.abs(y.astype(np.float32) - want).max() < 1e-2, form
