"""The native decode step (`python -m quantize native-step`, edgeocr.backends.native_step).  On the CPU its launch
list runs through the kernels' numpy twins (EDGEOCR_NATIVE_STEP=numpy) over the session's own buffers and the KV
cache ONNX Runtime's prefill wrote: the same logits and tokens as ONNX Runtime's own step on the artifact it was
made from (tiny random models of two shapes, exported and fused; the trained demo model on eval pages).  The CUDA
kernels are compiled here by NVRTC for Orin, Ada and Hopper; they run only on a GPU (tests/test_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import CACHE_LEN, PREFILL_LEN, make_image

from edgeocr.artifact import read
from edgeocr.decode import DecodeOptions
from edgeocr.model import OCRModel
from edgeocr.slots import drive


def _export(ckpt, out, **kw):
    from quantize.export import ExportOptions, export
    export(ckpt, out, ExportOptions(cache_len=CACHE_LEN, prefill_len=PREFILL_LEN, **kw))
    return out


@pytest.fixture(scope="module")
def arts(ckpt_a, ckpt_b, tmp_path_factory):
    """tiny-a (GQA 2, head 32, tied lm_head) and tiny-b (GQA 6, head 24, its own lm_head), 3 slots: the gqa +
    in-graph-selection export and its native-step form; tiny-b's portable fusion and its native-step form."""
    from quantize.fuse import FuseOptions, fuse_artifact
    from quantize.native_step import native_step_artifact
    root = tmp_path_factory.mktemp("native")
    a = {}
    for name, ck in (("a", ckpt_a), ("b", ckpt_b)):
        a[name] = _export(ck, root / name, slots=3, attention="gqa", select_on_device=True)
        native_step_artifact(a[name], root / f"{name}-native")
        a[f"{name}-native"] = root / f"{name}-native"
    fuse_artifact(a["b"], root / "b-fused", FuseOptions(target="portable"))
    native_step_artifact(root / "b-fused", root / "b-fused-native")
    a.update({"b-fused": root / "b-fused", "b-fused-native": root / "b-fused-native"})
    return a


def _pages(n):
    return [make_image(70 + i, (420 + 60 * i, 900 - 50 * i)) for i in range(n)]


LENGTHS = [3, 11, 5, 8, 2, 7, 9]


def _run(model, pages, lengths=LENGTHS, **sched_kw):
    sched = model.scheduler(**sched_kw)
    reqs = [(i, model.page(p, task="spotting", options=DecodeOptions(max_new_tokens=n, repetition_penalty=1.3)))
            for i, (p, n) in enumerate(zip(pages, lengths))]
    done = {}
    for events in drive(sched, reqs):
        done.update((ev.tag, ev.result.token_ids) for ev in events if ev.result is not None)
    return [done[i] for i in range(len(pages))]


def test_the_pass_moves_the_weights_out_of_the_graph(arts):
    """The decoder's projections read graph inputs bound to decoder_step.bin: the weights are stored once."""
    import onnx
    for name in ("a-native", "b-fused-native"):
        m = read(arts[name])
        spec = m.decoder.native_step
        g = onnx.load(str(arts[name] / m.decoder.file), load_external_data=False).graph
        ops = [n.op_type for n in g.node]
        inits = {i.name for i in g.initializer}
        assert all(n.input[1] not in inits or "rope" in n.input[1] for n in g.node if n.op_type == "MatMul")
        layers = m.model["text"]["num_layers"]
        assert ops.count("FusedMatMul") == layers * (4 if name == "a-native" else 5)
        assert {i.name for i in g.input} >= set(spec["inputs"])
        base = arts[name.replace("-native", "")]
        before = (base / (m.decoder.file + ".data")).stat().st_size
        after = (arts[name] / (m.decoder.file + ".data")).stat().st_size
        weights = (arts[name] / spec["file"]).stat().st_size
        assert after < 0.1 * before and abs(after + weights - before) < 0.05 * before, (before, after, weights)
        assert spec["tensors"]["layers.0.gate_up"]["shape"] == [2 * m.model["text"]["intermediate_size"],
                                                                  m.hidden_size]


@pytest.mark.parametrize("pair", [("a", "a-native"), ("b", "b-native"), ("b-fused", "b-fused-native")])
def test_same_tokens_as_onnx_runtimes_step(arts, pair, monkeypatch):
    """7 pages of 2-11 tokens through 3 slots, pages admitted as slots free: the native step's tokens (numpy
    twins) equal ONNX Runtime's step on the artifact it was made from, and ONNX Runtime's step on the native-step
    artifact (its weights bound as inputs) gives them too."""
    pages = _pages(7)
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "0")
    ref = _run(OCRModel(arts[pair[0]]), pages)
    ort_step = OCRModel(arts[pair[1]])
    assert ort_step.session.engine == "onnxruntime"
    assert _run(ort_step, pages) == ref
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "numpy")
    model = OCRModel(arts[pair[1]])
    assert model.session.engine == "native-numpy" and model.session.name.endswith("+native-numpy")
    assert _run(model, pages) == ref
    assert len({tuple(t) for t in ref}) > 3                 # the pages really differ


def test_step_logits_match_onnx_runtime(arts, monkeypatch):
    """Three prompts prefilled, then steps with one slot idle for a while and tokens the device did not choose (each
    written from the host): the native step's logits, chosen tokens and KV cache rows equal ONNX Runtime's step
    within float32 rounding (tiny-b: its own lm_head, GQA 6)."""
    from edgeocr.backends.ort import open_ort_session
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "numpy")
    nat = open_ort_session(arts["b-native"], read(arts["b-native"]))
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "0")
    ref = open_ort_session(arts["b"], read(arts["b"]))
    rng = np.random.default_rng(0)
    d, vocab = ref.head_dim, ref.vocab_size
    sels = [s.selection() for s in (ref, nat)]
    pos = np.array([40, 25, 60], np.int64)
    for slot, n in enumerate(pos):
        ids = rng.integers(0, vocab, n)
        cos, sin = (rng.uniform(-1, 1, (n, d)).astype(np.float32) for _ in range(2))
        firsts = [sel.first(slot, ids, 1.3, cos, sin) for sel in sels]
        assert firsts[0] == firsts[1]
    from edgeocr import rope
    r = ref.art.rope
    table_cos, table_sin = rope.text_table(ref.cache_len, rope.inv_freq(r.head_dim, r.theta, r.alpha))
    for step in range(5):
        live = np.array([True, step not in (1, 2), True])
        tokens = rng.integers(0, vocab, 3)
        cos, sin = table_cos[pos], table_sin[pos]      # a generated token's rows (the native step gathers them)
        outs = [sel.next(tokens, pos, cos, sin, live, np.zeros(3, np.int64)).copy() for sel in sels]
        logits = [s.mem.read(s.logits, s.h_logits).copy() for s in (ref, nat)]
        np.testing.assert_allclose(logits[1][live], logits[0][live], rtol=1e-4, atol=1e-4)
        assert (outs[0][live] == outs[1][live]).all()
        pos = pos + live
    for i in range(ref.layers):
        for slot in range(3):
            rows = int(pos[slot])
            np.testing.assert_allclose(nat.keys[i].host[slot, :, :rows], ref.keys[i].host[slot, :, :rows], atol=1e-5)
            np.testing.assert_allclose(nat.values[i].host[slot, :, :rows], ref.values[i].host[slot, :, :rows],
                                       atol=1e-5)


@pytest.fixture(scope="module")
def demo_native(demo_arts, tmp_path_factory):
    from quantize.native_step import native_step_artifact
    root = tmp_path_factory.mktemp("demo-native")
    native_step_artifact(demo_arts["fp32"], root / "float")
    native_step_artifact(demo_arts["fp32"], root / "int8", weights="int8")
    return {"float": root / "float", "int8": root / "int8"}


def test_the_demo_model_reads_the_same(demo_arts, demo_native, monkeypatch):
    """The trained model on two eval pages, two slots busy: the native step writes the text ONNX Runtime's does,
    and with 8-bit weights the text ONNX Runtime's MatMulNBits step writes over the same bytes, which stays close
    to the float model's."""
    from pathlib import Path

    from PIL import Image

    from edgeocr.metrics import cer
    root = Path(__file__).resolve().parents[1] / "calibration_data" / "eval"
    pages = [Image.open(root / f"{i:06d}.jpg").convert("RGB") for i in range(2)]
    opts = DecodeOptions(max_new_tokens=60)
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "0")
    ref = dict(OCRModel(demo_arts["fp32"]).recognize_many(pages, options=opts))
    ref8 = dict(OCRModel(demo_native["int8"]).recognize_many(pages, options=opts))
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "numpy")
    got = dict(OCRModel(demo_native["float"]).recognize_many(pages, options=opts))
    got8 = dict(OCRModel(demo_native["int8"]).recognize_many(pages, options=opts))
    assert [got[i].token_ids for i in range(2)] == [ref[i].token_ids for i in range(2)]
    assert [got8[i].token_ids for i in range(2)] == [ref8[i].token_ids for i in range(2)]
    assert all(len(ref[i].text) > 20 for i in range(2))
    assert all(cer(got8[i].text, ref[i].text) < 0.1 for i in range(2)), [(got8[i].text, ref[i].text) for i in range(2)]


def test_the_pass_refuses_what_the_step_cannot_run(ckpt_b, arts, tmp_path):
    from quantize.native_step import native_step_artifact
    host = _export(ckpt_b, tmp_path / "host", attention="gqa")
    with pytest.raises(ValueError, match="--attention gqa --select-on-device"):
        native_step_artifact(host, tmp_path / "x")
    with pytest.raises(ValueError, match="already has its native decode step"):
        native_step_artifact(arts["a-native"], tmp_path / "y")
    with pytest.raises(ValueError, match="OUT must differ"):
        native_step_artifact(arts["a"], arts["a"])
    from quantize.weight_int8 import build_cpu
    build_cpu(arts["b-fused"], tmp_path / "w8")
    with pytest.raises(ValueError, match="weight-int8: the native decode step starts from an FP16 or FP32"):
        native_step_artifact(tmp_path / "w8", tmp_path / "z")


def test_the_plan_is_eight_kernels_a_layer(arts):
    """What the CUDA graph replays: embedding and first norm, 8 kernels a layer, lm_head and a two-pass selection
    (ONNX Runtime's fused step: 15 a layer and 63 outside them, docs/perf.md)."""
    from edgeocr.backends.native_step import Dims, step_plan
    d = Dims(layers=24, hidden=1024, inter=3584, nq=16, kvh=8, head_dim=128, vocab=120818, cache_len=4096,
             eps=1e-5, lm_head="embed")
    plan = step_plan(d, 1, sms=132)
    assert len(plan) == 2 + 8 * 24 + 3 == 197
    plan = step_plan(d, 1, sms=132, state=True)       # the runtime's: its inputs from the device state
    assert len(plan) == 198 and plan[0].kernel == "step_begin"
    # every GEMV grid covers its rows: rows per block = 8 warps / KS
    for launch in plan:
        if launch.kernel in ("gemv", "gemvf", "swiglu"):
            rows, ks = launch.args[3][1], int(launch.symbol.rsplit("ks", 1)[1])
            assert launch.grid[0] * (8 // ks) >= rows > (launch.grid[0] - 1) * (8 // ks)


@pytest.mark.parametrize("arch", ["sm_75", "sm_87", "sm_89", "sm_90"])
def test_the_kernels_compile_for_orin_ada_and_hopper(arch):
    """NVRTC compiles the step's kernels for the real decoder's shape and a tiny one, and every symbol a plan
    launches is in the cubin: the tensor-core GEMVs from sm_80 on, the CUDA-core ones everywhere (sm_75: the
    tensor-core file compiles to nothing)."""
    from edgeocr.backends import nvrtc
    from edgeocr.backends.native_step import SOURCE, TC_MIN_SLOTS, Dims, kernel_defines, step_plan
    with_tc = int(arch[3:]) >= 80
    for slots, head, group in ((1, 128, 2), (8, 32, 2)):       # tiny widths: tensor cores from 8 slots
        d = Dims(layers=2, hidden=256, inter=512, nq=2 * group, kvh=2, head_dim=head, vocab=1000, cache_len=512,
                 eps=1e-5, lm_head="embed")
        cubin = nvrtc.compile_cubin(SOURCE, arch, kernel_defines(d, slots, tensor_cores=with_tc))
        from dataclasses import replace
        for sms in (16, 132):
            for tc in (False, True) if with_tc else (False,):
                symbols = {launch.symbol for q8 in (False, True) for q8e in (False, True)
                           for launch in step_plan(replace(d, q8=q8, q8_embed=q8e), slots, sms, state=True,
                                                   tensor_cores=tc)}
                missing = {s for s in symbols if s.encode() not in cubin}
                assert not missing and "step_begin" in symbols, missing
                pre = "tc_" if tc and slots >= 8 else ""
                assert any(s.startswith(f"{pre}swiglu_q8_m{slots}_") for s in symbols), symbols
                assert any(s.startswith(f"{pre}gemvf_m{slots}_") for s in symbols), symbols
                assert any(s.startswith(f"{pre}gemvf_q8_m{slots}_") for s in symbols), symbols
                assert "embed_rows_q8" in symbols
        assert (b"tc_gemv_m" in cubin) == (with_tc and slots >= TC_MIN_SLOTS)     # compiled only where taken
    assert TC_MIN_SLOTS > 1


def test_programmatic_dependent_launch_is_compiled_from_hopper_on(monkeypatch):
    """With -DPDL every kernel of the step, the tensor-core GEMVs included, first waits for the one before it and
    only then lets the next one be scheduled and touches memory (griddepcontrol, sm_90 on: checked in the PTX of
    every entry); without it no kernel does; the sm_87 cubin (Orin) is the same either way.  EDGEOCR_PDL switches
    it, on by default from sm_90, and any other value than 0 or 1 is an error.  The launch structures have cuda.h's
    layout (CUlaunchAttribute 72 bytes, its value at 8; CUlaunchConfig 56, the stream at 32, the attributes at 40,
    their count at 48)."""
    import ctypes
    import re

    from edgeocr.backends import nvrtc
    from edgeocr.backends.native_step import PDL_ENV, SOURCE, Dims, kernel_defines, pdl_enabled
    d = Dims(layers=2, hidden=256, inter=512, nq=4, kvh=2, head_dim=128, vocab=1000, cache_len=512, eps=1e-5,
             lm_head="embed")
    memory = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:ld|st|atom|red|cp\.async)\.(?!param)", re.M)
    for slots in (1, 8):                             # 8: the tensor-core GEMVs too
        defines = kernel_defines(d, slots, tensor_cores=True)
        entries = re.split(r"\.visible \.entry ", nvrtc.compile_ptx(SOURCE, "sm_90", {**defines, "PDL": 1}))[1:]
        assert len(entries) > 30 and (slots == 1 or any(e.startswith("tc_") for e in entries))
        for e in entries:
            wait, release = e.find("griddepcontrol.wait"), e.find("griddepcontrol.launch_dependents")
            first = memory.search(e)
            assert 0 <= wait < release and (first is None or first.start() > release), e.split("(")[0]
        assert "griddepcontrol" not in nvrtc.compile_ptx(SOURCE, "sm_90", defines)
    defines = kernel_defines(d, 1)
    assert nvrtc.compile_cubin(SOURCE, "sm_87", defines) == nvrtc.compile_cubin(SOURCE, "sm_87", {**defines, "PDL": 1})
    monkeypatch.delenv(PDL_ENV, raising=False)
    assert pdl_enabled("sm_90") and pdl_enabled("sm_100") and not pdl_enabled("sm_89")
    monkeypatch.setenv(PDL_ENV, "0")
    assert not pdl_enabled("sm_90")
    monkeypatch.setenv(PDL_ENV, "yes")
    with pytest.raises(ValueError, match="EDGEOCR_PDL must be 0 or 1"):
        pdl_enabled("sm_90")
    assert (ctypes.sizeof(nvrtc.LaunchAttribute), nvrtc.LaunchAttribute.value.offset) == (72, 8)
    c = nvrtc.LaunchConfig
    assert (ctypes.sizeof(c), c.stream.offset, c.attrs.offset, c.num_attrs.offset) == (56, 32, 40, 48)


def test_a_driver_without_launch_ex_refuses_programmatic_launch_only():
    """A CUDA driver older than 11.8 has no cuLaunchKernelEx: a launch with programmatic dependent launch raises
    BackendError (the session then builds the step without it), a plain launch still goes through cuLaunchKernel."""
    from edgeocr.backends import nvrtc
    from edgeocr.errors import BackendError
    calls = []

    class OldDriver:                                  # what ctypes finds in an old libcuda.so.1: no cuLaunchKernelEx
        @staticmethod
        def cuLaunchKernel(*args):
            calls.append(args)
            return 0

    m = object.__new__(nvrtc.Module)
    m.cu, m._launch_ex, m.fns = OldDriver(), getattr(OldDriver, "cuLaunchKernelEx", None), {"k": 1}
    m.launch("k", (2,), (32,), 0, [])
    assert len(calls) == 1
    with pytest.raises(BackendError, match="cuLaunchKernelEx"):
        m.launch("k", (2,), (32,), 0, [], pdl=True)
    assert len(calls) == 1


def test_tensor_core_gemvs_cover_their_rows():
    """A tensor-core GEMV's grid covers its rows (16 a warp, 8 / KS warps a block) and takes them only where the
    reduction size is a multiple of 32 and the step has TC_MIN_SLOTS slots or more; the rest stay on the CUDA-core
    kernels."""
    from edgeocr.backends.native_step import Dims, step_plan
    d = Dims(layers=2, hidden=1024, inter=3584, nq=16, kvh=8, head_dim=128, vocab=120818, cache_len=4096,
             eps=1e-5, lm_head="embed")
    plan = step_plan(d, 8, sms=132, state=True, tensor_cores=True)
    gemvs = [launch for launch in plan if launch.kernel in ("gemv", "gemvf", "swiglu")]
    assert gemvs and all(launch.symbol.startswith("tc_") for launch in gemvs)
    for launch in gemvs:
        rows, ks = launch.args[3][1], int(launch.symbol.rsplit("ks", 1)[1])
        per_block = 16 * (8 // ks)
        assert launch.grid[0] * per_block >= rows > (launch.grid[0] - 1) * per_block
    from dataclasses import replace
    odd = step_plan(replace(d, hidden=1000, inter=3000), 8, sms=132, state=True, tensor_cores=True)
    by_k = {launch.args[4][1]: launch.symbol for launch in odd if launch.kernel in ("gemv", "swiglu")}
    assert not by_k[1000].startswith("tc_") and not by_k[3000].startswith("tc_") and by_k[2048].startswith("tc_")
    one = step_plan(d, 1, sms=132, state=True, tensor_cores=True)
    assert not any(launch.symbol.startswith("tc_") for launch in one)
    four = {launch.args[3][1]: launch.symbol for launch in step_plan(d, 4, sms=132, state=True, tensor_cores=True)
            if launch.kernel in ("gemv", "gemvf", "swiglu")}
    assert four[4096].startswith("tc_") and four[3584].startswith("tc_") and four[120818].startswith("tc_")
    assert not four[1024].startswith("tc_")              # o and down (1,024 rows) on the CUDA cores until 8 slots


def test_where_the_cuda_kernels_apply():
    from edgeocr.backends.native_step import Dims, cuda_problem
    d = Dims(layers=2, hidden=1024, inter=3584, nq=16, kvh=8, head_dim=128, vocab=10, cache_len=64, eps=1e-5,
             lm_head="embed")
    assert cuda_problem(d, 8, np.float16) is None
    assert "FP16" in cuda_problem(d, 1, np.float32)
    assert "9 slots" in cuda_problem(d, 9, np.float16)
    from dataclasses import replace
    assert "head size 24" in cuda_problem(replace(d, head_dim=24), 1, np.float16)


@pytest.mark.parametrize("weights", ["float", "int8", "int8-embedding"])
def test_the_kernel_check_compares_each_launch_with_its_twin(arts, q8_arts, weights, monkeypatch):
    """CudaStep.check's bookkeeping (the GPU's per-kernel diagnostic) on the CPU: a stand-in module whose
    "launch" runs the numpy twin on the session's buffers in place.  Every output of every kernel is compared,
    and all agree exactly."""
    from edgeocr.backends import native_step as ns
    from edgeocr.backends.memory import HostMemory
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "numpy")
    m = OCRModel({"float": arts["a-native"], "int8": q8_arts["a-q8"], "int8-embedding": q8_arts["a-q8e"]}[weights])
    _run(m, _pages(3), [4, 6, 5])
    s = m.session
    plan = ns.step_plan(s.dims, s.slots, state=True)
    bufs = s._native_bufs
    live = ns.NumpyStep(plan, {k: b.host for k, b in bufs.items()}, s.w_dtype)
    order = iter(plan)

    class Module:                       # the launches come in plan order
        def launch(self, symbol, grid, block, stream, args, pdl):
            launch = next(order)
            assert launch.symbol == symbol and launch.args == args and pdl is True    # the step's own flag
            getattr(live, "k_" + launch.kernel)(launch, *[live._arg(a) for a in launch.args])

    class Rt:
        @staticmethod
        def make_current():
            pass

        @staticmethod
        def stream_sync(stream):
            pass

    step = object.__new__(ns.CudaStep)
    step.rt, step.mod, step.stream, step.pdl = Rt(), Module(), 0, True
    step.calls = [(launch.symbol, launch.grid, launch.block, launch.args) for launch in plan]
    rows = step.check(plan, bufs, HostMemory(), s.w_dtype)
    kinds = {r["kernel"] for r in rows}
    unused = {"gemv", "swiglu"} if weights != "float" else {"gemv_q8", "swiglu_q8"}
    unused |= {"embed_rows", "gemvf"} if weights == "int8-embedding" else {"embed_rows_q8", "gemvf_q8"}
    assert kinds == set(ns.OUTPUTS) - unused, kinds
    # the state's inputs (seen, ids, cos, sin); embedding, first norm (x, xn); a layer: q|k|v, RoPE (q, k, v),
    # attention (its counters, back at 0, and its output), o, norm (x, xn), SwiGLU, down, norm (x, xn); lm_head;
    # selection (next, rows)
    assert len(rows) == 4 + 1 + 2 + s.dims.layers * (1 + 3 + 2 + 1 + 2 + 1 + 1 + 2) + 1 + 2
    assert all(r.get("mismatches", 0) == 0 and r.get("max_rel_err", 0) == 0 for r in rows), rows


def test_fp16_twins_match_the_exported_graphs_reference(tmp_path):
    """scripts/gpu_native_step_torch.py --cpu: the launch list's numpy twins with FP16 buffers against the exported
    graph's own computation (quantize/torch_model.py's Decoder + DeviceSelect, FP16 in torch) on random weights and
    a cache 100 rows deep: logits within FP16 rounding, the same tokens, the same cache rows."""
    import importlib.util
    import json
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_native_step_torch.py"
    spec = importlib.util.spec_from_file_location("gpu_native_step_torch", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for weights in ("float", "int8"):
        assert mod.main(["--cpu", "--slots", "1", "3", "--weights", weights, "--json", str(tmp_path / "r.json")]) == 0
        runs = json.loads((tmp_path / "r.json").read_text())["runs"]
        assert [r["slots"] for r in runs] == [1, 3]
        for r in runs:
            assert r["tokens_agree"] and r["rows_advanced"] and r["seen_marked"], r
            assert r["logits_max_rel_err"] < 3e-3 and r["kv_max_rel_err"] < 3e-3, r


def test_a_steady_step_writes_nothing_from_the_host(arts, monkeypatch):
    """The step takes its state from the device (the last step's tokens, their seen marks, the RoPE table's rows,
    each slot's row, advanced in the step): counted on the session's memory, a step between admissions and leaves
    writes nothing from the host, and a step after one writes a few values for that slot only."""
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "numpy")
    m = OCRModel(arts["b-native"])
    s = m.session
    sel = s.selection()
    assert type(sel).__name__ == "NativeStateSelection"

    from test_step_state import _CountingMemory
    mem = s.mem = _CountingMemory(s.mem)
    record, last, last_pos = [], np.zeros(s.slots, bool), np.zeros(s.slots, np.int64)

    class Counted:
        where = sel.where

        def first(self, *a):
            return sel.first(*a)

        def next(self, tokens, pos, cos, sin, live, out):
            nonlocal last, last_pos
            before = mem.writes
            r = sel.next(tokens, pos, cos, sin, live, out)
            # a page admitted or gone since the last step: a live flag changed, or a live slot did not move on a row
            changed = bool((live != last).any() or (live & (pos != last_pos + 1)).any())
            record.append((mem.writes - before, changed))
            last, last_pos = live.copy(), pos.copy()
            return r

    s.selection = lambda: Counted()
    try:
        _run(m, _pages(7))
    finally:
        s.mem = mem.inner
        del s.selection
    quiet = [w for w, changed in record if not changed]
    assert len(quiet) >= 10 and set(quiet) == {0}, record
    assert all(w <= 3 * s.slots for w, _ in record), record


def test_prefill_beside_and_vision_ahead_give_the_same_tokens(arts, monkeypatch):
    """Vision on the worker and each prefill on the second decoder session while the native step decodes the other
    slots (the idle slot being prefilled is given the row just past its prompt, written into the device state):
    the tokens of ONNX Runtime's step, page by page."""
    pages = _pages(7)
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "0")
    ref = _run(OCRModel(arts["b"]), pages)
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "numpy")
    model = OCRModel(arts["b-native"])
    sched_kw = dict(vision_ahead=True, prefill_beside=True)
    assert model.scheduler(**sched_kw).prefill_beside
    assert _run(model, pages, **sched_kw) == ref


@pytest.fixture(scope="module")
def q8_arts(arts, tmp_path_factory):
    from quantize.native_step import native_step_artifact
    root = tmp_path_factory.mktemp("native-q8")
    native_step_artifact(arts["a"], root / "a-q8", weights="int8", embedding="float")
    native_step_artifact(arts["a"], root / "a-q8e", weights="int8", embedding="int8")      # tied, exported lm_head
    native_step_artifact(arts["b-fused"], root / "b-fused-q8e", embedding="int8")          # untied, fused (Gemm)
    return {"a-q8": root / "a-q8", "a-q8e": root / "a-q8e", "b-fused-q8e": root / "b-fused-q8e"}


@pytest.mark.parametrize("name,src,tables", [("a-q8e", "a-native", ["embed"]),
                                             ("b-fused-q8e", "b-fused-native", ["embed", "lm_head"])])
def test_int8_embedding_is_read_from_its_blocks_by_both(arts, q8_arts, name, src, tables):
    """--embedding int8: the embedding (and an untied lm_head) is uint8 [V', H] (V rounded up to a multiple of 8)
    with a scale per 32 values; the
    prefill looks rows up with GatherBlockQuantized and its lm_head is MatMulNBits over the same bytes (tied:
    the one table serves both), no graph input is a float table, and the file holds a quarter of their bytes."""
    import onnx
    m = read(q8_arts[name])
    spec, t = m.decoder.native_step, m.decoder.native_step["tensors"]
    assert spec["embedding"] == "int8"
    for tab in tables:
        assert t[tab]["dtype"] == "uint8" and t[tab + ".scales"]["shape"] == [t[tab]["shape"][0],
                                                                                 t[tab]["shape"][1] // 32]
    g = onnx.load(str(q8_arts[name] / m.decoder.file), load_external_data=False).graph
    ops = [n.op_type for n in g.node]
    assert ops.count("GatherBlockQuantized") == 1 and "Gather" not in [
        n.op_type for n in g.node if any(x.startswith("native.") for x in n.input)]
    lm = [n for n in g.node if n.op_type == "MatMulNBits" and n.input[1].startswith("native." + tables[-1])]
    assert len(lm) == 1 and lm[0].output[0] in {o for n in g.node for o in n.input} | {o.name for o in g.output}
    floats = {i.name for i in g.input if i.name.startswith("native.") and i.type.tensor_type.elem_type != 2
              and not i.name.endswith(".scales") and i.name.split(".")[1] in ("embed", "lm_head")}
    assert not floats, floats
    text = m.model["text"]
    v, rows = text["vocab_size"], -(-text["vocab_size"] // 8) * 8
    assert v % 8 and all(t[x]["shape"] == [rows, text["hidden_size"]] for x in tables)
    # MatMulNBits over every stored row (a multiple of 8: ONNX Runtime's CUDA one-row kernel, no dequantized copy of
    # the table), then a Slice back to the vocabulary
    assert lm[0].attribute and {a.name: a.i for a in lm[0].attribute}["N"] == rows
    sl = [n for n in g.node if n.input and n.input[0] == lm[0].output[0]]
    assert [n.op_type for n in sl] == ["Slice"]
    assert m.export["native_step"]["embedding_8bit_nodes"] == 2             # the lookup and the lm_head
    ref = read(arts[src] if src in arts else q8_arts[src]).decoder.native_step
    size = lambda spec, x: int(np.prod(spec["tensors"][x]["shape"])) * np.dtype(spec["tensors"][x].get(    # noqa: E731
        "dtype", spec["dtype"])).itemsize
    assert all(size(spec, x) * 4 == size(ref, x) * rows // v for x in tables)   # FP32 -> one byte a value


@pytest.mark.parametrize("name", ["a-q8e", "b-fused-q8e"])
def test_int8_embedding_same_tokens_as_onnx_runtimes_step(q8_arts, name, monkeypatch):
    """The 8-bit embedding and lm_head twins give the tokens of ONNX Runtime's step (GatherBlockQuantized,
    MatMulNBits) over the same bytes, 7 pages through 3 slots."""
    pages = _pages(7)
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "0")
    ref = _run(OCRModel(q8_arts[name]), pages)
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "numpy")
    model = OCRModel(q8_arts[name])
    assert model.session.dims.q8_embed
    from edgeocr.backends.native_step import step_plan
    assert {launch.kernel for launch in step_plan(model.session.dims, 3)} >= {"embed_rows_q8", "gemvf_q8"}
    assert _run(model, pages) == ref
    assert len({tuple(r) for r in ref}) > 3


def test_int8_embedding_of_version_2_still_runs(arts, tmp_path, monkeypatch):
    """Artifacts written before the 8-bit tables were padded (version 2: [V, H] rows, the lm_head's MatMulNBits over
    V rows and no Slice) still load, and their native step gives ONNX Runtime's step's tokens; `--weights int8`
    alone now writes the padded form (version 3) with the 8-bit embedding."""
    import quantize.native_step as ns
    fresh = ns.native_step_artifact(arts["a"], tmp_path / "v3", weights="int8").decoder.native_step
    assert (fresh["version"], fresh["embedding"], fresh["tensors"]["embed"]["shape"][0]) == (3, "int8", 416)
    monkeypatch.setattr(ns, "pad_rows", lambda q, scales: (q, scales))
    monkeypatch.setitem(ns.NATIVE_STEP_VERSION, "int8", 2)
    old = ns.native_step_artifact(arts["a"], tmp_path / "v2", weights="int8", embedding="int8")
    assert (old.decoder.native_step["version"], old.decoder.native_step["tensors"]["embed"]["shape"][0]) == (2, 413)
    pages = _pages(4)
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "0")
    ref = _run(OCRModel(tmp_path / "v2"), pages, LENGTHS[:4])
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "numpy")
    assert _run(OCRModel(tmp_path / "v2"), pages, LENGTHS[:4]) == ref


def test_int8_embedding_bad_choices_are_named(arts, tmp_path):
    """An unknown --embedding is refused before anything is written; where the hidden width is not a multiple of
    32 the CUDA kernels say why they cannot take an 8-bit embedding."""
    from edgeocr.backends.native_step import Dims, cuda_problem
    from quantize.native_step import native_step_artifact
    with pytest.raises(ValueError, match="embedding must be 'float' or 'int8', not 'int4'"):
        native_step_artifact(arts["a"], tmp_path / "q", embedding="int4")
    assert not (tmp_path / "q").exists()
    d = Dims(layers=2, hidden=40, inter=64, nq=2, kvh=1, head_dim=32, vocab=100, cache_len=64, eps=1e-5,
             lm_head="embed", q8_embed=True)
    assert "8-bit embedding" in cuda_problem(d, 1, np.float16)
    assert cuda_problem(Dims(**{**d.__dict__, "hidden": 64}), 1, np.float16) is None


def test_a_native_slot_prefilled_with_prompts_of_other_lengths(arts, q8_arts, monkeypatch):
    """The kept prefill binding (its ~weight inputs bound once, OrtSession._prefill_binding) with the native
    step's weights and an 8-bit embedding: prompts of other lengths one after another on one model give a fresh
    model's tokens, on the numpy twins and on ONNX Runtime's step."""
    from edgeocr import prompts
    page = _pages(1)[0]
    tasks = prompts.task_names()
    o = DecodeOptions(max_new_tokens=5, repetition_penalty=1.2)
    for mode in ("numpy", "0"):
        monkeypatch.setenv("EDGEOCR_NATIVE_STEP", mode)
        for art in (arts["a-native"], q8_arts["a-q8e"]):
            model = OCRModel(art)
            seq = [model.recognize(page, task=t, options=o) for t in tasks + tasks[:1]]
            assert len({r.prompt_tokens for r in seq}) > 2
            fresh = [OCRModel(art).recognize(page, task=t, options=o).token_ids for t in tasks]
            assert [r.token_ids for r in seq] == fresh + fresh[:1]
            assert len(model.session._pf_bindings) == 1


def test_int8_weights_are_matmul_nbits_blocks_read_by_both(arts, q8_arts):
    """--weights int8: each projection is uint8 [n, k] with one scale per 32 values, the graph reads those bytes
    through MatMulNBits (no float copy anywhere), and the file is a quarter of the FP32 one's projections."""
    import onnx
    m = read(q8_arts["a-q8"])
    spec = m.decoder.native_step
    assert spec["weights"] == "int8" and spec["block"] == 32
    t = spec["tensors"]
    assert t["layers.0.qkv"]["dtype"] == "uint8" and t["layers.0.qkv.scales"]["dtype"] == "float32"
    assert t["layers.0.qkv.scales"]["shape"] == [t["layers.0.qkv"]["shape"][0], t["layers.0.qkv"]["shape"][1] // 32]
    g = onnx.load(str(q8_arts["a-q8"] / m.decoder.file), load_external_data=False).graph
    ops = [n.op_type for n in g.node]
    assert ops.count("MatMulNBits") == 4 * m.model["text"]["num_layers"] and "FusedMatMul" not in ops
    q8 = (q8_arts["a-q8"] / spec["file"]).stat().st_size
    f32 = (arts["a-native"] / read(arts["a-native"]).decoder.native_step["file"]).stat().st_size
    assert q8 < 0.6 * f32, (q8, f32)
    # the vision graph's MatMul weights are 8-bit blocks too (the default with 8-bit weights)
    vg = onnx.load(str(q8_arts["a-q8"] / m.vision.file), load_external_data=False).graph
    vis = m.export["native_step"]["vision"]
    assert vis["weights"] == "int8" and vis["matmuls_quantized"] == vis["matmuls_total"] > 0
    assert [n.op_type for n in vg.node].count("MatMulNBits") == vis["matmuls_quantized"]
    src_vision = arts["a"] / read(arts["a"]).vision.file
    vbytes = lambda d: sum(f.stat().st_size for f in d.glob(m.vision.file + "*"))     # noqa: E731
    assert vbytes(q8_arts["a-q8"]) < vbytes(src_vision.parent)      # tiny-a's vision is mostly its patch embedding
    from quantize.native_step import quantize_rows
    w = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    q, s = quantize_rows(w)
    back = (q.astype(np.float32) - 128) * np.repeat(s, 32, axis=1)
    assert np.abs(back - w).max() <= np.repeat(s, 32, axis=1).max() / 2 + 1e-6


def test_int8_weights_can_keep_the_float_vision_graph(arts, tmp_path):
    """--vision float beside --weights int8: the vision graph is the source's, byte for byte."""
    from quantize.native_step import native_step_artifact
    m = native_step_artifact(arts["a"], tmp_path / "q", weights="int8", vision="float")
    assert m.export["native_step"]["vision"] == {"weights": "float"}
    for f in (m.vision.file, m.vision.file + ".data"):
        if (arts["a"] / f).exists():
            assert (tmp_path / "q" / f).read_bytes() == (arts["a"] / f).read_bytes()
    # the runtime's vision CUDA graph default follows the vision weights (edgeocr.ort_options.vision_graph_default),
    # not the decoder's: FP16 vision weights keep it off beside 8-bit decoder weights, 8-bit ones turn it on beside
    # FP16 decoder weights; an artifact native-step did not make has none
    from edgeocr.ort_options import native_vision_weights
    mixed = native_step_artifact(arts["a"], tmp_path / "f", weights="float", vision="int8")
    assert mixed.decoder.native_step["weights"] == "float" and native_vision_weights(mixed) == "int8"
    assert native_vision_weights(m) == "float" and native_vision_weights(read(arts["a"])) is None
    with pytest.raises(ValueError, match="vision must be"):
        native_step_artifact(arts["a"], tmp_path / "r", weights="int8", vision="int4")


def test_int8_weights_same_tokens_as_onnx_runtimes_step(q8_arts, monkeypatch):
    """The 8-bit twins (dequantize, then the GEMV) give the tokens of ONNX Runtime's MatMulNBits step over the same
    bytes, 7 pages through 3 slots."""
    pages = _pages(7)
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "0")
    ref = _run(OCRModel(q8_arts["a-q8"]), pages)
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "numpy")
    model = OCRModel(q8_arts["a-q8"])
    assert model.session.dims.q8
    assert _run(model, pages) == ref


def test_int8_weights_refused_where_blocks_do_not_fit(arts, tmp_path):
    from quantize.native_step import native_step_artifact
    with pytest.raises(ValueError, match="attention width 144 is not a multiple of 32"):
        native_step_artifact(arts["b"], tmp_path / "q", weights="int8")
    assert not (tmp_path / "q").exists()


def _broken_copy(src, dst, edit):
    """A copy of a native-step artifact whose manifest's native_step entry `edit` changes."""
    import json
    import shutil
    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    edit(m["graphs"]["decoder"]["native_step"])
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


@pytest.mark.parametrize("case", ["row_past_tensor", "shape", "missing_tensor", "float_over_int8", "file_outside",
                                  "unmapped_input", "unaligned_offset", "embedding_int8_over_float",
                                  "padded_rows_as_version_2", "newer_version"])
def test_a_malformed_native_step_entry_is_refused_at_load(arts, q8_arts, tmp_path, case, monkeypatch):
    """What a hand-edited or damaged manifest could make the graph read past a buffer or read uint8 as floats is
    an ArtifactError naming the entry, before anything is bound (a row past its tensor used to crash the
    process)."""
    from edgeocr.errors import ArtifactError
    src = {"float_over_int8": q8_arts["a-q8"], "padded_rows_as_version_2": q8_arts["a-q8e"]}.get(case, arts["a-native"])
    edits = {
        "row_past_tensor": (lambda s: s["inputs"]["native.layers.1.down"].__setitem__(1, 100000),
                            "does not lie inside layers.1.down"),
        "shape": (lambda s: s["tensors"]["layers.0.qkv"].__setitem__("shape", [96, 64]), "layers.0.qkv has shape"),
        "missing_tensor": (lambda s: s["tensors"].pop("norm"), "has no 'norm'"),
        "float_over_int8": (lambda s: s.__setitem__("weights", "float"), "is uint8, expected float32"),
        "file_outside": (lambda s: s.__setitem__("file", "../x/decoder_step.bin"), "file name inside the artifact"),
        "unmapped_input": (lambda s: s["inputs"].pop("native.layers.0.qkv"), "does not map"),
        "unaligned_offset": (lambda s: s["tensors"]["norm"].__setitem__("offset", s["tensors"]["norm"]["offset"] + 8),
                             "norm has offset .* multiple of 256"),
        "embedding_int8_over_float": (lambda s: s.__setitem__("embedding", "int8"), "embed is float32, expected uint8"),
        # version 2 had the 8-bit tables unpadded: padded rows under it are a damaged entry, not a wider vocabulary
        "padded_rows_as_version_2": (lambda s: s.__setitem__("version", 2),
                                     r"embed has shape \[416, 64\], the model's sizes say \[413, 64\]"),
        "newer_version": (lambda s: s.__setitem__("version", 4), "reads versions 1, 2, 3: update edgeocr"),
    }
    edit, message = edits[case]
    art = _broken_copy(src, tmp_path / case, edit)
    for mode in ("0", "numpy"):
        monkeypatch.setenv("EDGEOCR_NATIVE_STEP", mode)
        with pytest.raises(ArtifactError, match=message):
            OCRModel(art)
    from edgeocr.doctor import load_problem
    assert load_problem(read(art), "cpu")                  # doctor says so too


def test_an_empty_weights_file_is_an_artifact_error(arts, tmp_path):
    import json
    import shutil

    from edgeocr.errors import ArtifactError
    art = tmp_path / "empty"
    shutil.copytree(arts["a-native"], art)
    (art / "decoder_step.bin").write_bytes(b"")
    m = json.loads((art / "manifest.json").read_text())
    m["files"]["decoder_step.bin"]["bytes"] = 0
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="runs past the end of the file|cannot read"):
        OCRModel(art)


def test_writing_into_a_reslot_copy_leaves_the_source_alone(arts, tmp_path):
    """`quantize reslot` hard-links an artifact's files; a pass writing into such a folder replaces its files
    instead of writing through the links into the source artifact."""
    import hashlib
    import shutil

    from quantize.export import reslot
    from quantize.native_step import native_step_artifact
    src = tmp_path / "src"
    shutil.copytree(arts["a-native"], src)
    reslot(src, tmp_path / "r", slots=2)
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in src.iterdir()}
    native_step_artifact(arts["b"], tmp_path / "r")
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in src.iterdir()} == before


def test_other_passes_refuse_or_keep_native_step_artifacts(arts, tmp_path):
    from quantize.native_step import native_step_artifact
    from quantize.step_state import step_state_artifact
    from quantize.weight_int8 import build_cpu
    with pytest.raises(ValueError, match="native-step weights"):
        step_state_artifact(arts["a-native"], tmp_path / "ss")
    build_cpu(arts["b-fused"], tmp_path / "w8")
    with pytest.raises(ValueError, match="w8 is weight-int8"):
        native_step_artifact(tmp_path / "w8", tmp_path / "n")
    assert not (tmp_path / "n").exists()


def test_doctor_verify_finds_a_changed_byte(arts, tmp_path, capsys):
    import shutil

    from edgeocr.doctor import doctor
    art = tmp_path / "flip"
    shutil.copytree(arts["a-native"], art)
    assert doctor(str(art), None, verify=True) == 0
    assert "files match the manifest" in capsys.readouterr().out
    data = bytearray((art / "decoder_step.bin").read_bytes())
    data[1000] ^= 0x40
    (art / "decoder_step.bin").write_bytes(bytes(data))
    assert doctor(str(art), None, verify=True) == 1
    assert "differs from the manifest: decoder_step.bin" in capsys.readouterr().out


def test_a_pass_refuses_an_out_folder_of_other_files(arts, tmp_path):
    """A toolchain pass lists every file of OUT in the manifest and makes it readable by all: a folder holding
    anything else is refused, untouched."""
    from quantize.native_step import native_step_artifact
    out = tmp_path / "scratch"
    out.mkdir()
    (out / "secret.txt").write_text("x")
    (out / "secret.txt").chmod(0o600)
    with pytest.raises(ValueError, match="holds secret.txt, which is not part of an artifact"):
        native_step_artifact(arts["a"], out)
    assert (out / "secret.txt").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in out.iterdir()) == ["secret.txt"]


def test_doctor_says_which_decode_step_runs(arts, capsys, monkeypatch):
    from edgeocr.doctor import doctor, native_step_engine
    monkeypatch.delenv("EDGEOCR_NATIVE_STEP", raising=False)
    assert doctor(str(arts["a-native"]), None) == 0
    assert "decode step" in capsys.readouterr().out
    m = read(arts["a-native"])
    assert native_step_engine(m, "cpu") == "ONNX Runtime's (the native step runs on CUDA)"
    assert "FP16" in native_step_engine(m, "cuda")          # tiny-a's export is FP32
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "0")
    assert native_step_engine(m, "cuda") == "ONNX Runtime's (EDGEOCR_NATIVE_STEP=0)"


@pytest.mark.parametrize("target", ["portable", "cuda"])
def test_a_fused_decoder_whose_norms_are_equal_keeps_their_names(ckpt_a, tmp_path, target):
    """The exporter shares one initializer between equal weights (Identity aliases), as a random-weight real-size
    checkpoint's all-ones norms are; the fusion keeps each small alias as a copy under its own name, so the native
    step's pass finds every layer's norm in the fused graph (it stopped at decoder.layers.0.ln1 before)."""
    import shutil

    import onnx
    from safetensors.numpy import load_file, save_file

    from quantize.fuse import FuseOptions, fuse_artifact
    from quantize.native_step import native_step_artifact
    ck = tmp_path / "ones"
    shutil.copytree(ckpt_a, ck)
    for f in ck.glob("*.safetensors"):
        w = load_file(str(f))
        for name in w:
            if "language_model" in name or name.startswith("model.layers") or ".norm" in name:
                if w[name].ndim == 1 and "norm" in name:
                    w[name] = np.ones_like(w[name])
        save_file(w, str(f), metadata={"format": "pt"})
    exp = _export(ck, tmp_path / "exp", slots=1, attention="gqa", select_on_device=True)
    g = onnx.load(str(exp / read(exp).decoder.file), load_external_data=False).graph
    assert any(n.op_type == "Identity" and ".ln" in n.output[0] for n in g.node), \
        "the exporter no longer shares equal weights: this test no longer builds the case it is about"
    fuse_artifact(exp, tmp_path / "fused", FuseOptions(target=target))
    fg = onnx.load(str(tmp_path / "fused" / read(tmp_path / "fused").decoder.file), load_external_data=False).graph
    names = {i.name for i in fg.initializer}
    layers = read(exp).model["text"]["num_layers"]
    assert {f"decoder.layers.{i}.{n}" for i in range(layers) for n in ("ln1", "ln2", "qn", "kn")} <= names
    assert not any(n.op_type == "Identity" for n in fg.node)
    native_step_artifact(tmp_path / "fused", tmp_path / "native")
    spec = read(tmp_path / "native").decoder.native_step
    raw = np.memmap(tmp_path / "native" / spec["file"], dtype=np.uint8, mode="r")
    t = spec["tensors"]["layers.1.ln2"]
    ln2 = raw[t["offset"]:t["offset"] + 4 * t["shape"][0]].view(np.float32)
    assert (ln2 == 1).all()


def test_int8_vision_weights_take_the_vision_gemm_passes_of_a_fused_artifact(arts, tmp_path):
    """With 8-bit vision weights, a fused artifact's vision graph first gets the passes of `fuse --vision-gemms`
    (q, k, v as three MatMuls without the Split; the patch Conv as a MatMul, kept unquantized): the same
    embeddings as without them (per-column blocks quantize the same), recorded in the manifest; off with
    --no-vision-gemms, skipped for an unfused artifact and for one fused with them already."""
    import collections

    import onnx
    import onnx.numpy_helper
    import onnxruntime as ort

    from quantize.cli import main
    from quantize.fuse import FuseOptions, fuse_artifact
    from quantize.native_step import native_step_artifact

    def ops(d):
        g = onnx.load(str(d / read(d).vision.file), load_external_data=False).graph
        return collections.Counter(n.op_type for n in g.node)

    def embeds(d):
        sess = ort.InferenceSession(str(d / read(d).vision.file), providers=["CPUExecutionProvider"])
        return sess.run(None, {"pixels": pixels})[0]

    with_passes = native_step_artifact(arts["b-fused"], tmp_path / "g", vision="int8")   # tiny-b: float decoder
    report = with_passes.export["native_step"]["vision"]["gemm_passes"]
    layers = read(arts["b"]).model["vision"]["num_layers"]
    assert report == {"attention_qkv": layers, "patch_gemm": 1}
    assert main(["native-step", str(arts["b-fused"]), str(tmp_path / "n"), "--vision", "int8",
                 "--no-vision-gemms"]) == 0
    assert read(tmp_path / "n").export["native_step"]["vision"]["gemm_passes"] == {"skipped": "not asked"}
    before, after = ops(tmp_path / "n"), ops(tmp_path / "g")
    assert before["Split"] == layers and after["Split"] == 0 and after["Conv"] == before["Conv"] - 1
    assert after["MatMulNBits"] == before["MatMulNBits"] + 2 * layers           # q|k|v: one weight -> three
    pixels = np.random.default_rng(5).standard_normal((1, 3, 1024, 1024)).astype(np.float32)
    assert np.abs(embeds(tmp_path / "g") - embeds(tmp_path / "n")).max() < 1e-4
    with pytest.raises(ValueError, match="8-bit vision weights"):
        native_step_artifact(arts["b-fused"], tmp_path / "f", vision="float", vision_gemms=True)
    m = native_step_artifact(arts["a"], tmp_path / "u", weights="int8")
    assert m.export["native_step"]["vision"]["gemm_passes"] == {"skipped": "the artifact is not fused"}
    fuse_artifact(arts["b"], tmp_path / "bg", FuseOptions(target="portable", vision_gemms=True))
    m = native_step_artifact(tmp_path / "bg", tmp_path / "bgn", vision="int8")
    assert m.export["native_step"]["vision"]["gemm_passes"] == {"skipped": "already applied by the fusion"}
    # the same vision graph as fusing with --vision-gemms (what docs/perf.md section 18 measured): ops and weights
    ga, gb = (onnx.load(str(d / read(d).vision.file)).graph for d in (tmp_path / "g", tmp_path / "bgn"))
    assert sorted(n.op_type for n in ga.node) == sorted(n.op_type for n in gb.node)
    wa, wb = ({t.name: onnx.numpy_helper.to_array(t) for t in g.initializer} for g in (ga, gb))
    assert wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wa)


def test_int8_vision_packed_qkv_gives_the_three_projection_embeddings(arts, tmp_path):
    """q, k and v as one MatMul whose columns are reordered to [head, q|k|v, dim], read by MultiHeadAttention as its
    packed q|k|v input (the default for an artifact fused for CUDA; --vision-qkv packed) instead of three MatMuls:
    per-column 8-bit blocks quantize the same columns, so the embeddings are the three-projection graph's.  The
    packed input is CUDA-only: the manifest says so (the runtime refuses the CPU), a portable fusion keeps three
    MatMuls and refuses packed."""
    import collections

    import onnx
    import onnxruntime as ort

    from edgeocr.doctor import load_problem
    from quantize.cli import main
    from quantize.fuse import FuseOptions, fuse_artifact, portable_equivalent
    from quantize.native_step import PACKED_QKV_OP, native_step_artifact

    def graph(d):
        return onnx.load(str(d / read(d).vision.file), load_external_data=False).graph

    def embeds(d):       # the packed input is CUDA-only: on the CPU through fuse.portable_equivalent
        model = onnx.load(str(d / read(d).vision.file))
        portable_equivalent(model)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, {"pixels": pixels})[0]

    fuse_artifact(arts["b"], tmp_path / "cuda", FuseOptions(target="cuda"))
    packed = native_step_artifact(tmp_path / "cuda", tmp_path / "packed", vision="int8")
    assert main(["native-step", str(tmp_path / "cuda"), str(tmp_path / "three"), "--vision", "int8",
                 "--vision-qkv", "three"]) == 0
    three = read(tmp_path / "three")
    layers = read(arts["b"]).model["vision"]["num_layers"]
    for m, layout in ((packed, "packed"), (three, "three")):
        v = m.export["native_step"]["vision"]
        assert v["gemm_passes"] == {"attention_qkv": layers, "patch_gemm": 1} and v["qkv"] == layout
    assert PACKED_QKV_OP in packed.export["fusion"]["cuda_only_ops"]
    assert PACKED_QKV_OP not in three.export["fusion"]["cuda_only_ops"]
    # a CUDA fusion without GroupQueryAttention's norms loads on the CPU: three stays its default, packed is asked
    fuse_artifact(arts["b"], tmp_path / "cuda-plain", FuseOptions(target="cuda", gqa_qk_norm=False))
    plain3 = native_step_artifact(tmp_path / "cuda-plain", tmp_path / "plain3", vision="int8")
    plainp = native_step_artifact(tmp_path / "cuda-plain", tmp_path / "plainp", vision="int8", vision_qkv="packed")
    assert plain3.export["native_step"]["vision"]["qkv"] == "three" and load_problem(plain3, "cpu") is None
    assert plainp.export["native_step"]["vision"]["qkv"] == "packed"
    assert PACKED_QKV_OP in load_problem(plainp, "cpu")
    assert plainp.export["fusion"]["cuda_only_ops"] == [PACKED_QKV_OP]
    ops3 = collections.Counter(n.op_type for n in graph(tmp_path / "three").node)
    opsp = collections.Counter(n.op_type for n in graph(tmp_path / "packed").node)
    assert opsp["MatMulNBits"] == ops3["MatMulNBits"] - 2 * layers and opsp["Split"] == 0
    mhas = [n for n in graph(tmp_path / "packed").node if n.op_type == "MultiHeadAttention"]
    assert len(mhas) == layers and all(list(n.input[1:3]) == ["", ""] and n.input[3] for n in mhas)
    pixels = np.random.default_rng(5).standard_normal((1, 3, 1024, 1024)).astype(np.float32)
    a, b = embeds(tmp_path / "three"), embeds(tmp_path / "packed")
    assert np.abs(a - b).max() < 1e-4 * max(1.0, float(np.abs(a).max()))
    # a portable fusion keeps three MatMuls, and refuses packed; the layout needs 8-bit vision weights
    assert native_step_artifact(arts["b-fused"], tmp_path / "p3", vision="int8").export["native_step"]["vision"][
        "qkv"] == "three"
    with pytest.raises(ValueError, match="--target cuda"):
        native_step_artifact(arts["b-fused"], tmp_path / "bad", vision="int8", vision_qkv="packed")
    with pytest.raises(ValueError, match="q.k.v layout must be one of"):
        native_step_artifact(tmp_path / "cuda", tmp_path / "bad2", vision="int8", vision_qkv="interleaved")
    with pytest.raises(ValueError, match="8-bit vision weights"):
        native_step_artifact(tmp_path / "cuda", tmp_path / "bad3", vision="float", vision_qkv="three")
    with pytest.raises(ValueError, match="do not run here .not asked"):
        native_step_artifact(tmp_path / "cuda", tmp_path / "bad4", vision="int8", vision_qkv="packed",
                             vision_gemms=False)
