"""CUDA execution provider against the CPU one (run on a GPU machine: pytest -m gpu)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import make_image
from edgeocr.decode import DecodeOptions
from edgeocr.model import OCRModel
from test_parity import run_recorded

pytestmark = pytest.mark.gpu


def test_cuda_session_matches_cpu(art_a, art_b):
    import onnxruntime as ort          # a GPU run without it is a failure, not a skip
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.fail("CUDAExecutionProvider not available on this machine")
    for art in (art_a, art_b):
        cpu, gpu = OCRModel(art, device="cpu"), OCRModel(art, device="cuda")
        img = make_image(3)
        rc, lc = run_recorded(cpu, img, task="spotting", n=24)
        rg, lg = run_recorded(gpu, img, task="spotting", n=24)
        assert rc.token_ids == rg.token_ids
        assert np.abs(lc - lg).max() < 2e-3
        # a second image on the same (reused) buffers
        r2c = cpu.recognize(make_image(4), options=DecodeOptions(max_new_tokens=12))
        r2g = gpu.recognize(make_image(4), options=DecodeOptions(max_new_tokens=12))
        assert r2c.token_ids == r2g.token_ids


def test_cuda_gqa_fp16_in_place(ckpt_a, tmp_path):
    """FP16 GroupQueryAttention flavour on CUDA: same prefill logits as the portable masked FP16 graph,
    decodes with the cache written in place by the graph (no host row copies)."""
    from conftest import _export
    gqa = _export(ckpt_a, tmp_path / "gqa16", precision="fp16", attention="gqa")
    masked = _export(ckpt_a, tmp_path / "masked16", precision="fp16")
    g, mk = OCRModel(gqa, device="cuda"), OCRModel(masked, device="cuda")
    assert g.session.inplace and not hasattr(g.session, "st_new")
    img = make_image(5)
    rg, lg = run_recorded(g, img, task="spotting", n=24)
    rm, lm = run_recorded(mk, img, task="spotting", n=24)
    assert np.abs(lg[0] - lm[0]).max() < 5e-2
    assert rg.generated_tokens == 24 or rg.finish_reason == "stop"


def test_cuda_graph_decode_matches_plain_steps(ckpt_a, tmp_path):
    """gqa + selection in the graph, FP16: the decode step replayed as a CUDA graph gives the same tokens
    as the same artifact run step by step, on two images (the graph is captured once and reused)."""
    from conftest import _export
    art = _export(ckpt_a, tmp_path / "fast16", precision="fp16", attention="gqa", select_on_device=True)
    plain, graph = OCRModel(art, device="cuda", cuda_graph=False), OCRModel(art, device="cuda", cuda_graph=True)
    auto = OCRModel(art, device="cuda")
    assert auto.session.cuda_graph and not plain.session.cuda_graph
    for seed in (6, 7):
        o = DecodeOptions(max_new_tokens=40, repetition_penalty=1.3)
        assert plain.recognize(make_image(seed), options=o).token_ids == graph.recognize(make_image(seed), options=o).token_ids


# ---- on the trained demo model, whose outputs vary (random tiny models repeat one token) ----

def _demo_export(tmp_path, name, **kw):
    from pathlib import Path

    from quantize.export import ExportOptions, export
    out = tmp_path / name
    export(Path(__file__).resolve().parents[1] / "demo_model", out,
           ExportOptions(cache_len=2048, prefill_len=1280, **kw))
    return out


def test_demo_fast_flavours_on_cuda(tmp_path):
    """FP16 demo model on CUDA: the gqa + in-graph selection flavour with the decode step replayed as a
    CUDA graph gives exactly the tokens of the same artifact run step by step, on two eval pages (the graph
    is captured once and replayed for the second page), and the same first 12 tokens as the portable
    masked FP16 graph with host selection; its weight-only INT8 copy (MatMulNBits) also runs under the CUDA
    graph, identical to its own plain steps, and starts like FP16."""
    from pathlib import Path

    from edgeocr.dataset import load_dir
    from quantize.weight_int8 import build_weight_int8
    pages = load_dir(Path(__file__).resolve().parents[1] / "calibration_data" / "eval")[:2]
    fast = _demo_export(tmp_path, "fast16", precision="fp16", attention="gqa", select_on_device=True)
    masked = _demo_export(tmp_path, "masked16", precision="fp16")
    w8 = tmp_path / "w8"
    build_weight_int8(fast, w8)
    o = DecodeOptions(max_new_tokens=200, ignore_stop=True)
    runs = {}
    for name, art, graph in (("plain", fast, False), ("graph", fast, True), ("masked", masked, False),
                             ("w8", w8, False), ("w8graph", w8, True)):
        m = OCRModel(art, device="cuda", cuda_graph=graph)
        runs[name] = [m.recognize(p.path, task="structured_parse", options=o).token_ids for p in pages]
    for k in range(2):
        assert len(set(runs["plain"][k])) > 20
        assert runs["graph"][k] == runs["plain"][k]
        assert runs["masked"][k][:12] == runs["plain"][k][:12]
        assert runs["w8graph"][k] == runs["w8"][k]
        assert runs["w8"][k][:12] == runs["plain"][k][:12]


@pytest.mark.parametrize("flavour", [dict(precision="fp16", attention="gqa", select_on_device=True),
                                     dict(precision="fp16"), dict(precision="fp32")])
def test_cuda_slots_equal_alone(ckpt_b, tmp_path, flavour):
    """4-slot artifacts on CUDA (gqa + in-graph selection under the CUDA graph; masked FP16 and FP32 with
    the host's 2-D row copies per slot): 6 pages decoded together get each page's solo tokens, and FP32
    matches the CPU."""
    from conftest import _export
    art = _export(ckpt_b, tmp_path / "slots", slots=4, **flavour)
    m = OCRModel(art, device="cuda")
    assert m.slots == 4
    o = DecodeOptions(max_new_tokens=16, repetition_penalty=1.3)
    pages = [make_image(40 + i, (500 + 40 * i, 800)) for i in range(6)]
    alone = [m.recognize(p, options=o).token_ids for p in pages]
    many = dict(m.recognize_many(pages, options=o))
    assert [many[i].token_ids for i in range(6)] == alone
    if flavour["precision"] == "fp32":
        cpu = OCRModel(art, device="cpu")
        assert [cpu.recognize(p, options=o).token_ids for p in pages] == alone


def test_demo_slots_on_cuda_graph(tmp_path, monkeypatch):
    """The demo model's fast FP16 flavour with 8 slots under the CUDA graph: 10 eval pages decoded together
    equal each page decoded alone (real text, varied lengths: pages stop at their own end token), with each
    page's vision waiting for its slot and with vision ahead (on its own thread and stream)."""
    from pathlib import Path

    from edgeocr.dataset import load_dir
    pages = load_dir(Path(__file__).resolve().parents[1] / "calibration_data" / "eval")[:10]
    art = _demo_export(tmp_path, "fast16x8", precision="fp16", attention="gqa", select_on_device=True, slots=8)
    m = OCRModel(art, device="cuda")
    assert m.session.cuda_graph and m.slots == 8
    o = DecodeOptions(max_new_tokens=300)
    alone = [m.recognize(p.path, task="structured_parse", options=o) for p in pages]
    many = dict(m.recognize_many([p.path for p in pages], task="structured_parse", options=o))
    assert [many[i].token_ids for i in range(10)] == [r.token_ids for r in alone]
    monkeypatch.setenv("EDGEOCR_VISION_AHEAD", "1")
    ahead = dict(m.recognize_many([p.path for p in pages], task="structured_parse", options=o))
    assert [ahead[i].token_ids for i in range(10)] == [r.token_ids for r in alone]
    assert len({r.generated_tokens for r in alone}) > 3
    for env in ({"EDGEOCR_PREFILL_BESIDE": "1"}, {"EDGEOCR_PREFILL_BESIDE": "1", "EDGEOCR_STREAM_PRIORITIES": "1"}):
        for k, v in env.items():         # prefill beside the step (a second decoder session), and on prioritized
            monkeypatch.setenv(k, v)     # streams (a new model: the streams are chosen when the sessions load)
        mb = OCRModel(art, device="cuda")
        assert mb.scheduler().prefill_beside
        beside = dict(mb.recognize_many([p.path for p in pages], task="structured_parse", options=o))
        assert [beside[i].token_ids for i in range(10)] == [r.token_ids for r in alone], env


def test_demo_step_state_on_cuda_graphs(tmp_path, monkeypatch):
    """`quantize step-state` of the demo model's unfused fast FP16 flavour with 3 slots, its two step bindings
    replayed as two CUDA graphs, vision ahead on (EDGEOCR_VISION_AHEAD=1): 6 eval pages give the tokens of the artifact it was made
    from, and no step writes a slot's state from the host."""
    from pathlib import Path

    from edgeocr.dataset import load_dir
    from quantize.step_state import step_state_artifact
    pages = [p.path for p in load_dir(Path(__file__).resolve().parents[1] / "calibration_data" / "eval")[:6]]
    art = _demo_export(tmp_path, "fast16x3", precision="fp16", attention="gqa", select_on_device=True, slots=3)
    step_state_artifact(art, tmp_path / "state")
    monkeypatch.setenv("EDGEOCR_VISION_AHEAD", "1")
    ref, state = OCRModel(art, device="cuda"), OCRModel(tmp_path / "state", device="cuda")
    assert state.scheduler().vision_ahead
    assert state.session.cuda_graph and state.session.capture_steps == 6
    o = DecodeOptions(max_new_tokens=200)
    want = dict(ref.recognize_many(pages, task="structured_parse", options=o))
    got = dict(state.recognize_many(pages, task="structured_parse", options=o))
    assert {i: r.token_ids for i, r in got.items()} == {i: r.token_ids for i, r in want.items()}
    assert state.session.resyncs == 0


def test_demo_prefill_and_vision_graphs_on_cuda(tmp_path, monkeypatch):
    """EDGEOCR_PREFILL_GRAPH=1 (the default for native-step artifacts) and EDGEOCR_VISION_GRAPH=1 (prefills and the
    vision graph replayed as ONNX Runtime CUDA graphs, captured on their third run): the demo model's fast FP16
    flavour, one page at a time (ONNX Runtime's step graph too), and its 3-slot native-step form (asked for vision
    ahead, which the vision graph turns off), give the tokens of the same artifacts without them, with pages enough
    that every graph is captured and then replayed."""
    from pathlib import Path

    from edgeocr.dataset import load_dir
    from quantize.native_step import native_step_artifact
    pages = [p.path for p in load_dir(Path(__file__).resolve().parents[1] / "calibration_data" / "eval")[:6]]
    one = _demo_export(tmp_path, "fast16", precision="fp16", attention="gqa", select_on_device=True)
    three = _demo_export(tmp_path, "fast16x3", precision="fp16", attention="gqa", select_on_device=True, slots=3)
    native_step_artifact(three, tmp_path / "native", weights="float")
    o = DecodeOptions(max_new_tokens=120)
    monkeypatch.setenv("EDGEOCR_PREFILL_GRAPH", "0")          # on by default where the artifact allows it
    plain = OCRModel(one, device="cuda")
    assert not plain.session.prefill_graph
    want_one = [plain.recognize(p, task="structured_parse", options=o).token_ids for p in pages]
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "1")
    monkeypatch.setenv("EDGEOCR_VISION_AHEAD", "1")
    nat = OCRModel(tmp_path / "native", device="cuda")
    want_many = {i: r.token_ids for i, r in nat.recognize_many(pages, task="structured_parse", options=o)}
    del plain, nat
    monkeypatch.setenv("EDGEOCR_PREFILL_GRAPH", "1")
    monkeypatch.setenv("EDGEOCR_VISION_GRAPH", "1")
    g = OCRModel(one, device="cuda")
    assert g.session.prefill_graph and g.session.vision_graph and g.session.cuda_graph
    assert [g.recognize(p, task="structured_parse", options=o).token_ids for p in pages] == want_one
    assert sum(g.session._vision_runs.values()) == 6 and not g.session.vision_capture_pending()
    assert max(g.session._pf_graph_runs.values()) == 6 and not g.session.prefill_capture_pending(0, len(
        g.prompt_ids(g.instruction("structured_parse", None)[0])))
    del g
    nat = OCRModel(tmp_path / "native", device="cuda")
    # with the vision graph, vision ahead is off (ONNX Runtime keeps a graph per thread): visions run in line
    assert nat.session.engine == "native-cuda" and nat.session.prefill_graph and not nat.scheduler().vision_ahead
    for _ in range(3):                    # 18 prefills over 3 slots: each slot's graph captured, then replayed
        got = {i: r.token_ids for i, r in nat.recognize_many(pages, task="structured_parse", options=o)}
        assert got == want_many
    assert len(want_one[0]) > 20 and len({len(t) for t in want_many.values()}) > 1


@pytest.mark.parametrize("weights, vision", [("float", "float"), ("int8", "int8"), ("float", "int8")])
def test_demo_native_step_on_cuda(tmp_path, monkeypatch, weights, vision):
    """`quantize native-step` of the demo model's fast FP16 flavour with 3 slots, FP16 weights or 8-bit weights and
    embedding (the demo vocabulary, 2,213 rows, is not a multiple of 8: the 8-bit table is padded and the lm_head's
    logits sliced, as for the real one): every kernel of a decode step
    against its numpy twin on the page's real state (kernel by kernel), then 6 eval pages through the native CUDA
    step (one CUDA graph a step) give the tokens of ONNX Runtime's step on the same artifact, or part at a near
    tie: two FP16 engines that sum in different orders may pick either of two tokens whose logits are closer than
    FP16 resolves.  Where a page's tokens part, the FP32 reference (transformers) scores the two tokens at that
    step, repetition penalty applied: both must be within `near_tie` of the best token there, and at most one page
    may part.  With 8-bit vision weights (`--weights int8`, or `--vision int8` beside FP16 decoder weights) both
    engines replay the vision graph as a CUDA graph (the runtime's default for them).  The native step without
    programmatic dependent launch (EDGEOCR_PDL=0) gives the same tokens as with it."""
    from pathlib import Path

    from edgeocr.dataset import load_dir
    from edgeocr.prepare import open_preparer
    from quantize import reference
    from quantize.native_step import native_step_artifact
    near_tie = 0.05
    pages = [p.path for p in load_dir(Path(__file__).resolve().parents[1] / "calibration_data" / "eval")[:6]]
    art = _demo_export(tmp_path, "fast16x3", precision="fp16", attention="gqa", select_on_device=True, slots=3)
    native = native_step_artifact(art, tmp_path / "native", weights=weights, vision=vision)
    assert native.decoder.native_step["embedding"] == weights
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "1")
    monkeypatch.delenv("EDGEOCR_PDL", raising=False)                    # the default
    nat = OCRModel(tmp_path / "native", device="cuda")
    assert nat.session.engine == "native-cuda" and nat.preparer.engine == "kernels"    # the exact path's pixels
    assert nat.session.vision_graph == (vision == "int8")   # the default: replayed where 8-bit vision leaves room
    o = DecodeOptions(max_new_tokens=200)
    got = dict(nat.recognize_many(pages, task="structured_parse", options=o))
    rows = nat.session.check_kernels()
    bad = [r for r in rows if r.get("mismatches", 0) or r.get("max_rel_err", 0) > 2e-2 or not r.get("finite", True)]
    assert not bad, bad
    # programmatic dependent launch (the default from sm_90 on) changes when kernels start, never what they compute
    from edgeocr.backends import nvrtc
    arch = int(nvrtc.device_arch()[0][3:])
    assert nat.session._native.pdl == (arch >= 90)
    monkeypatch.setenv("EDGEOCR_PDL", "0")
    plain = OCRModel(tmp_path / "native", device="cuda")
    assert not plain.session._native.pdl
    assert {i: r.token_ids for i, r in plain.recognize_many(pages, task="structured_parse", options=o)} == \
        {i: r.token_ids for i, r in got.items()}
    del plain
    monkeypatch.delenv("EDGEOCR_PDL")
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "0")
    ref = OCRModel(tmp_path / "native", device="cuda")
    assert ref.session.engine == "onnxruntime" and ref.session.vision_graph == (vision == "int8")
    want = dict(ref.recognize_many(pages, task="structured_parse", options=o))
    a, b = ({i: r.token_ids for i, r in d.items()} for d in (got, want))
    assert set(a) == set(b) == set(range(len(pages)))
    parted = {}
    hf, exact = None, open_preparer("exact", nat.image_spec)
    ids = nat.prompt_ids(nat.instruction("structured_parse", None)[0])
    penalty = nat.artifact.repetition_penalty
    for i in a:
        k = next((k for k, (x, y) in enumerate(zip(a[i], b[i])) if x != y), None)
        if k is None:
            assert a[i] == b[i], f"page {i}: one engine stopped early ({len(a[i])} against {len(b[i])} tokens)"
            continue
        hf = hf or reference.load(Path(__file__).resolve().parents[1] / "demo_model")
        seq = np.concatenate([ids, np.asarray(a[i][:k], np.int64)])
        z = reference.logits(hf, exact(pages[i]).pixels, seq)[-1].astype(np.float64)
        seen = np.unique(seq)
        z[seen] = np.where(z[seen] > 0, z[seen] / penalty, z[seen] * penalty)
        top = np.sort(z)[::-1]
        parted[i] = {"step": k, "native": a[i][k], "onnxruntime": b[i][k],
                     "fp32_below_best": float(top[0] - min(z[a[i][k]], z[b[i][k]])),
                     "fp32_top2_margin": float(top[0] - top[1])}
    print("pages whose tokens part:", parted)
    assert len(parted) <= 1 and all(v["fp32_below_best"] <= near_tie for v in parted.values()), parted


def test_demo_packed_vision_qkv_on_cuda(tmp_path, monkeypatch):
    """The demo model's fast FP16 export fused for CUDA, made into the 8-bit native-step artifact: its vision graph
    feeds MultiHeadAttention's packed q|k|v input (the default for a CUDA fusion) and gives, on ONNX Runtime's CUDA
    provider, the embeddings of the same artifact built with three q, k, v MatMuls (`--vision-qkv three`), and the
    same tokens on 3 eval pages through the native step (the vision replayed as a CUDA graph)."""
    from pathlib import Path

    import onnxruntime as ort

    from edgeocr.artifact import read
    from edgeocr.dataset import load_dir
    from edgeocr.prepare import open_preparer
    from quantize.fuse import FuseOptions, fuse_artifact
    from quantize.native_step import PACKED_QKV_OP, native_step_artifact
    pages = [p.path for p in load_dir(Path(__file__).resolve().parents[1] / "calibration_data" / "eval")[:3]]
    art = _demo_export(tmp_path, "fast16", precision="fp16", attention="gqa", select_on_device=True)
    fuse_artifact(art, tmp_path / "fused", FuseOptions(target="cuda"))
    arts = {q: native_step_artifact(tmp_path / "fused", tmp_path / q, weights="int8", vision_qkv=None if q == "packed"
                                    else q) for q in ("packed", "three")}
    layers = arts["three"].model["vision"]["num_layers"]
    for q in arts:
        v = arts[q].export["native_step"]["vision"]
        assert v["qkv"] == q and v["gemm_passes"]["attention_qkv"] == layers
    assert PACKED_QKV_OP in arts["packed"].export["fusion"]["cuda_only_ops"]
    exact = open_preparer("exact", OCRModel(tmp_path / "packed", device="cuda").image_spec)
    x = np.asarray(exact(pages[0]).pixels, np.float32)
    emb = {}
    for q in arts:
        s = ort.InferenceSession(str(tmp_path / q / read(tmp_path / q).vision.file),
                                 providers=["CUDAExecutionProvider"])
        emb[q] = s.run(None, {"pixels": x})[0].astype(np.float32)
    assert np.abs(emb["packed"] - emb["three"]).max() <= 1e-3 * max(1.0, float(np.abs(emb["three"]).max()))
    monkeypatch.setenv("EDGEOCR_NATIVE_STEP", "1")
    o = DecodeOptions(max_new_tokens=120)
    toks = {}
    for q in arts:
        m = OCRModel(tmp_path / q, device="cuda")
        assert m.session.engine == "native-cuda" and m.session.vision_graph
        toks[q] = [m.recognize(p, task="structured_parse", options=o).token_ids for p in pages]
        del m
    assert toks["packed"] == toks["three"] and min(len(t) for t in toks["packed"]) > 10


@pytest.mark.parametrize("weights", ["float", "int8"])
def test_native_step_at_real_size_against_the_graphs_computation(tmp_path, weights):
    """scripts/gpu_native_step_torch.py on the GPU: the real decoder's sizes on random FP16 weights, 1 and 8
    slots, against the exported graph's computation in torch: logits, tokens, cache rows, the device state, and
    every kernel against its numpy twin.  In a process of its own: the script runs CUDA work in torch, which the
    other tests of this file, having loaded ONNX Runtime's CUDA provider into theirs, do not; a crash in it is then
    this test's failure with the script's output, not the end of the pytest process."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, str(root / "scripts" / "gpu_native_step_torch.py"), "--weights", weights,
                        "--replays", "20", "--json", str(out)], cwd=root, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, f"exit {p.returncode}:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    runs = json.loads(out.read_text())["runs"]
    assert all(r["tokens_agree"] and not r["kernel_check_bad"] for r in runs), runs


def test_letterbox_kernels_are_the_exact_path_bit_for_bit(tmp_path):
    """The CUDA letterbox kernels give the exact host path's pixels bit for bit on pages to shrink and to enlarge
    and on a tall strip whose vertical pass runs first, reusing one set of buffers; OCRModel on CUDA picks them by
    default and reads the demo model's eval pages with the exact path's tokens."""
    from pathlib import Path

    from PIL import Image

    from edgeocr import preprocess
    from edgeocr.dataset import load_dir
    from edgeocr.letterbox_cuda import CudaLetterbox
    from test_letterbox_cuda import SIZES, _page
    lb = CudaLetterbox()
    for w, h in SIZES + [(721, 1081)]:
        rgb = _page(w, h, w + 3 * h)
        canvas, geo = preprocess.letterbox(Image.fromarray(rgb))
        got, geo2 = lb(rgb)
        assert geo2 == geo
        np.testing.assert_array_equal(got.numpy(), preprocess.normalize(canvas), err_msg=f"{w}x{h}")
    art = _demo_export(tmp_path, "demo32", precision="fp32")
    dev, exact = OCRModel(art, device="cuda"), OCRModel(art, device="cuda", preprocess="exact")
    assert dev.preprocess == "device" and dev.preparer.engine == "kernels"
    pages = [p.path for p in load_dir(Path(__file__).resolve().parents[1] / "calibration_data" / "eval")[:3]]
    o = DecodeOptions(max_new_tokens=64)
    for p in pages:
        assert dev.recognize(p, options=o).token_ids == exact.recognize(p, options=o).token_ids
