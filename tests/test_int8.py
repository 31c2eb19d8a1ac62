"""INT8 toolchain on tiny checkpoints: explicit, symmetric Q/DQ where intended, none where excluded,
runnable in ONNX Runtime; the manifest records what stayed floating point and why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from conftest import make_image
from edgeocr.decode import DecodeOptions
from edgeocr.model import OCRModel
from quantize.int8 import Int8Options, build_int8, eligible_and_excluded, quantized_nodes

pytestmark = pytest.mark.filterwarnings("ignore")
CALIB = "calibration_data/calib"


@pytest.fixture(scope="module")
def art8(art_a, tmp_path_factory):
    import os
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    work = tmp_path_factory.mktemp("int8")
    # relative paths, as users type them (NNCF itself insists on an absolute external-data folder)
    cwd = os.getcwd()
    os.chdir(work)
    try:
        build_int8(Path(os.path.relpath(art_a, work)), Path(os.path.relpath(root / CALIB, work)), Path("tiny-a-int8"),
                   Int8Options(calib_images=6, holdout_images=2, decode_tokens=6))
    finally:
        os.chdir(cwd)
    return work / "tiny-a-int8"


def _model(path):
    return onnx.load(str(path), load_external_data=True)


@pytest.mark.parametrize("graph", ["vision", "decoder"])
def test_qdq_where_intended_symmetric_and_none_where_excluded(art_a, art8, graph):
    fp = _model(art_a / f"{graph}.onnx")
    q = _model(art8 / f"{graph}.onnx")
    eligible, excluded = eligible_and_excluded(fp, graph)
    quant = quantized_nodes(q)
    assert quant and quant <= set(eligible) | set(excluded)
    assert not quant & set(excluded), f"excluded nodes were quantized: {quant & set(excluded)}"
    inits = {t.name: t for t in q.graph.initializer}
    qs = [n for n in q.graph.node if n.op_type == "QuantizeLinear"]
    dqs = [n for n in q.graph.node if n.op_type == "DequantizeLinear"]
    assert qs and dqs
    for n in qs + dqs:
        zp = inits[n.input[2]]
        assert zp.data_type == TensorProto.INT8 and not np.any(numpy_helper.to_array(zp)), n.name   # symmetric
    weights = [inits[n.input[0]] for n in dqs if n.input[0] in inits]
    assert weights and all(w.data_type == TensorProto.INT8 for w in weights)       # int8 on disk
    # norms, softmax and RoPE are never quantized: no Q/DQ feeds Softmax, ReduceMean, Pow, Sqrt
    dq_out = {n.output[0] for n in dqs}
    assert not [n.name for n in q.graph.node if n.op_type in ("Softmax", "ReduceMean", "Pow", "Sqrt")
                and any(i in dq_out for i in n.input)]
    assert max(o.version for o in q.opset_import if o.domain in ("", "ai.onnx")) <= 20


def test_manifest_records_kept_fp_and_calibration(art8):
    from edgeocr.artifact import read
    m = read(art8)
    assert m.precision == "int8"
    info = m.export["int8"]
    assert len(info["calibration_sha256"]) == 64 and info["calibration_sha256"] != info["holdout_sha256"]
    dec = info["graphs"]["decoder"]
    assert "lm_head (tied embedding)" in dec["kept_fp"].values()
    assert "embedding gather" in dec["kept_fp"].values()
    assert "patch embedding (RGB input conv)" in info["graphs"]["vision"]["kept_fp"].values()
    assert dec["activation_quantizers"] == dec["symmetric_activation_quantizers"] > 0
    assert dec["gate_passed"] and info["graphs"]["vision"]["gate_passed"]


def test_int8_runs_in_onnxruntime_and_stays_close(art_a, art8):
    fp, q = OCRModel(art_a), OCRModel(art8)
    img = make_image(21)
    pf, pq = fp.prepare(img).pixels, q.prepare(img).pixels
    fp.session.encode_image(pf)
    q.session.encode_image(pq)
    ef, eq = fp.session.image_embeds(), q.session.image_embeds()
    cos = (ef * eq).sum(-1) / (np.linalg.norm(ef, axis=-1) * np.linalg.norm(eq, axis=-1))
    assert cos.mean() > 0.98
    from test_parity import run_recorded
    _, lf = run_recorded(fp, img, task="spotting", n=1)
    rq, lq = run_recorded(q, img, task="spotting", n=1)
    # random weights make near-tie argmaxes, so compare the whole prefill logit vector
    c = float((lf[0] * lq[0]).sum() / (np.linalg.norm(lf[0]) * np.linalg.norm(lq[0])))
    assert c > 0.8, c          # tiny random weights; real INT8 quality is measured on the trained model
    r = q.recognize(img, options=DecodeOptions(max_new_tokens=12))
    assert r.generated_tokens == 12 and r.finish_reason in ("length", "stop")
    sizes = lambda d: sum(p.stat().st_size for p in d.iterdir() if p.suffix == ".data")
    assert sizes(art8) < 0.75 * sizes(art_a)


def test_int8_of_the_gqa_flavour(gqa_arts, tmp_path):
    """The GroupQueryAttention decoder calibrates too (its capture feeds seqlens_k/total_sequence_length):
    Q/DQ on the projections around the contrib op, runs in place in ONNX Runtime, stays close."""
    out = tmp_path / "gqa-int8"
    root = Path(__file__).resolve().parents[1]
    m = build_int8(gqa_arts["a"], root / CALIB, out, Int8Options(calib_images=4, holdout_images=2, decode_tokens=6))
    assert m.decoder.attention == "gqa"
    dec = _model(out / "decoder.onnx")
    ops = [n.op_type for n in dec.graph.node]
    assert ops.count("GroupQueryAttention") == 2 and ops.count("DequantizeLinear") > 10
    fp, q = OCRModel(gqa_arts["a"]), OCRModel(out)
    img = make_image(22)
    from test_parity import run_recorded
    _, lf = run_recorded(fp, img, task="spotting", n=1)
    r, lq = run_recorded(q, img, task="spotting", n=1)
    c = float((lf[0] * lq[0]).sum() / (np.linalg.norm(lf[0]) * np.linalg.norm(lq[0])))
    assert c > 0.8, c


def test_large_kept_fp32_weights_stored_as_fp16(tmp_path):
    """The tied embedding stays FP32 arithmetic but is stored FP16 (+ Cast): half the bytes on disk, the
    same outputs for bf16-origin weights (bf16 values are exact in FP16), still a valid graph."""
    import onnxruntime as ort
    from onnx import helper

    from quantize.export import _save
    from quantize.int8 import store_large_fp32_as_fp16
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 64)).astype(np.float32)
    w = (w.view(np.uint32) & 0xFFFF0000).view(np.float32)          # bf16-representable, like a real checkpoint
    g = helper.make_graph(
        [helper.make_node("Gather", ["W", "ids"], ["emb"]),
         helper.make_node("MatMul", ["emb", "Wt"], ["logits"])],
        "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [3, 512])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.ascontiguousarray(w.T), "Wt"),
         numpy_helper.from_array(np.zeros(2, np.float32), "small")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    a = onnx.ModelProto()
    a.CopyFrom(m)
    _save(a, tmp_path / "a.onnx")
    ids = np.array([3, 77, 500], np.int64)
    ref = ort.InferenceSession(str(tmp_path / "a.onnx")).run(None, {"ids": ids})[0]
    assert sorted(store_large_fp32_as_fp16(m, min_bytes=64 << 10)) == ["W", "Wt"]
    _save(m, tmp_path / "b.onnx")
    assert (tmp_path / "b.onnx.data").stat().st_size < 0.55 * (tmp_path / "a.onnx.data").stat().st_size
    out = ort.InferenceSession(str(tmp_path / "b.onnx")).run(None, {"ids": ids})[0]
    np.testing.assert_array_equal(out, ref)
    assert {i.name for i in m.graph.initializer} == {"W_fp16", "Wt_fp16", "small"}
