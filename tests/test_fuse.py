"""Post-export fusions (quantize.fuse) on tiny checkpoints: every pass fires (op types counted before and
after), the fused graphs compute what the exported ones do on the CPU (FP32: tight tolerance, identical
tokens), the CUDA-only ops are checked through their portable equivalent, and the FP16 graph has the
structure the CUDA provider runs."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import CACHE_LEN, PREFILL_LEN, make_image
from edgeocr.decode import DecodeOptions
from edgeocr.artifact import read as read_manifest
from edgeocr.model import OCRModel
from quantize.fuse import FuseOptions, fuse_artifact, portable_equivalent

VISION_TOL = 2e-5     # max abs difference of image embeddings (values of order 1-5), FP32
LOGIT_TOL = 2e-5      # max abs difference of logits (values of order 1-10), FP32


def _export(ckpt, out, **kw):
    from quantize.export import ExportOptions, export
    export(ckpt, out, ExportOptions(cache_len=CACHE_LEN, prefill_len=PREFILL_LEN, attention="gqa",
                                    select_on_device=True, **kw))
    return out


@pytest.fixture(scope="module")
def fast(ckpt_a, ckpt_b, tmp_path_factory):
    """The fast flavour (gqa + selection in the graph), FP32 for both tiny configs and FP16 for tiny-a, each
    exported and fused for both targets."""
    root = tmp_path_factory.mktemp("fuse")
    arts = {}
    for name, ckpt, prec in (("a", ckpt_a, "fp32"), ("b", ckpt_b, "fp32"), ("a16", ckpt_a, "fp16")):
        arts[name] = _export(ckpt, root / name, precision=prec)
        for target in ("portable", "cuda"):
            arts[f"{name}-{target}"] = root / f"{name}-{target}"
            fuse_artifact(arts[name], arts[f"{name}-{target}"], FuseOptions(target=target))
    return arts


def _ops(path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


def _session(path, cuda_ops_expanded=False):
    m = onnx.load(str(path))
    if cuda_ops_expanded:
        assert portable_equivalent(m) > 0
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _decoder_feeds(sess, rng, image_embeds, s=7):
    """Prefill feeds for a fast-flavour decoder: s tokens (image slots included) over an empty cache."""
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 if d == "batch" else s for d in i.shape]
        if i.name == "input_ids":
            feeds[i.name] = rng.integers(0, 300, (1, s)).astype(np.int64)
        elif i.name == "image_embeds":
            feeds[i.name] = image_embeds
        elif i.name == "seqlens_k":
            feeds[i.name] = np.array([s - 1], np.int32)
        elif i.name == "total_sequence_length":
            feeds[i.name] = np.array(s, np.int32)
        elif i.name == "penalty":
            feeds[i.name] = np.array([1.08], np.float32)
        elif i.name in ("seen",) or i.name.startswith("past_"):
            feeds[i.name] = np.zeros(shape, np.float32)
        else:                                   # cos, sin
            feeds[i.name] = rng.uniform(-1, 1, shape).astype(np.float32)
    return feeds


@pytest.mark.parametrize("which", ["a", "b"])
@pytest.mark.parametrize("target", ["portable", "cuda"])
def test_fused_graphs_compute_the_exported_ones(fast, which, target):
    """Vision embeddings, prefill logits, the chosen token and every layer's cache rows: fused = exported
    (FP32, CPU).  The cuda target runs through `portable_equivalent` (CPU ONNX Runtime rejects its ops)."""
    art, fused = fast[which], fast[f"{which}-{target}"]
    rng = np.random.default_rng(3)
    pixels = rng.standard_normal((1, 3, 1024, 1024)).astype(np.float32)
    va = _session(art / "vision.onnx").run(None, {"pixels": pixels})[0]
    vb = _session(fused / "vision.onnx").run(None, {"pixels": pixels})[0]
    assert np.abs(va - vb).max() < VISION_TOL
    da, db = _session(art / "decoder.onnx"), _session(fused / "decoder.onnx", cuda_ops_expanded=target == "cuda")
    feeds = _decoder_feeds(da, rng, va[:5])
    outs = [o.name for o in da.get_outputs()]
    ra, rb = da.run(None, feeds), db.run(outs, feeds)
    for name, x, y in zip(outs, ra, rb):
        tol = 0 if name == "next_token" else LOGIT_TOL
        assert np.abs(x.astype(np.float64) - y).max() <= tol, name


def test_portable_fusions_fire(fast):
    """FP32 tiny-a (2 decoder layers, 2 vision layers): every RMSNorm fused (no Pow/ReduceMean/Sqrt left),
    residual Add + norm as one op (2 per layer but the first), the lm_head one Gemm; in the vision graph every
    LayerNormalization after the first a SkipLayerNormalization with the projection bias folded in, erf GELU
    as Gelu/BiasGelu, the q|k|v bias inside MultiHeadAttention."""
    dec_before, dec = _ops(fast["a"] / "decoder.onnx"), _ops(fast["a-portable"] / "decoder.onnx")
    assert dec_before["Pow"] == 9 and not (dec["Pow"] or dec["ReduceMean"] or dec["Sqrt"])
    assert dec["SkipSimplifiedLayerNormalization"] == 3 and dec["SimplifiedLayerNormalization"] == 2 + 4
    assert dec["Gemm"] == 1 and dec["Transpose"] == 0 and dec["GroupQueryAttention"] == 2
    vis_before, vis = _ops(fast["a"] / "vision.onnx"), _ops(fast["a-portable"] / "vision.onnx")
    assert vis_before["LayerNormalization"] == 4 and vis_before["Erf"] == 3
    assert vis["LayerNormalization"] == 1 and vis["SkipLayerNormalization"] == 3
    assert vis["SkipSimplifiedLayerNormalization"] == 1 and vis["SimplifiedLayerNormalization"] == 1
    assert vis["Erf"] == 0 and vis["BiasGelu"] == 2 and vis["Gelu"] == 1
    g = onnx.load(str(fast["a-portable"] / "vision.onnx"), load_external_data=False).graph
    assert all(len(n.input) == 4 for n in g.node if n.op_type == "MultiHeadAttention")       # bias input
    assert vis["Split"] == vis_before["Split"] == 2 and vis["Conv"] == vis_before["Conv"] == 3   # --vision-gemms
    assert all(len(n.input) == 5 for n in g.node if n.op_type == "SkipLayerNormalization")   # bias input
    assert sum(vis.values()) < 0.5 * sum(vis_before.values()) and sum(dec.values()) < 0.5 * sum(dec_before.values())


def test_cuda_target_structure_fp16(fast):
    """FP16 tiny-a fused for CUDA: no Split, Slice, SwiGLU (ONNX Runtime 1.31's CUDA provider has no kernel
    for it) or Cast inside a layer; q|k|v packed into each GroupQueryAttention with its layer's Q/K-norm weights
    (FP16) and the model's epsilon; RoPE one Mul and one MatMul a layer; gate and up two MatMuls; the norm casts
    of the vision graph gone (LayerNormalization in FP16, FP32 statistics)."""
    g = onnx.load(str(fast["a16-cuda"] / "decoder.onnx"), load_external_data=False).graph
    ops = Counter(n.op_type for n in g.node)
    assert ops["Split"] == 0 and ops["Slice"] == 0 and ops["SwiGLU"] == 0 and ops["Sigmoid"] == 2
    # Adds left: the packed cos table's "keep the value heads" (once per run), the last layer's residual (the
    # final norm reads the last position only, so it is no skip-norm); per layer 6 MatMuls: q|k|v, RoPE, o, gate,
    # up, down; 3 Muls (RoPE, silu, gate * up) per layer and 3 once per run (the packed cos/sin tables' masks,
    # the repetition penalty)
    assert ops["Add"] == 2 and ops["MatMul"] == 2 * 6 and ops["Mul"] == 2 * 3 + 3
    assert ops["SkipSimplifiedLayerNormalization"] == 3 and ops["SimplifiedLayerNormalization"] == 2
    inits = {t.name: t for t in g.initializer}
    for n in (n for n in g.node if n.op_type == "GroupQueryAttention"):
        assert n.input[1] == n.input[2] == "" and len(n.input) == 16
        qn, kn = inits[n.input[14]], inits[n.input[15]]
        assert qn.data_type == kn.data_type == onnx.TensorProto.FLOAT16 and list(qn.dims) == [32]
        assert {a.name: a.f for a in n.attribute}["qk_norm_epsilon"] == pytest.approx(1e-5)
    before = _ops(fast["a16"] / "decoder.onnx")
    assert before["Cast"] - ops["Cast"] == 2 * 9         # the fp32 wrapper of every RMSNorm
    vis = _ops(fast["a16-cuda"] / "vision.onnx")
    assert _ops(fast["a16"] / "vision.onnx")["Cast"] == 13 and vis["Cast"] == 1      # only the pixels' cast
    lns = [n for n in onnx.load(str(fast["a16-cuda"] / "vision.onnx"), load_external_data=False).graph.node
           if n.op_type in ("LayerNormalization", "SkipLayerNormalization")]
    assert lns and all(inits_t.data_type == onnx.TensorProto.FLOAT16 for inits_t in _weights(fast["a16-cuda"], lns))


def _step_feeds(sess, rng, batch: int, lengths: list[int]):
    """Decode-step feeds for a fast-flavour decoder: one token for each of `batch` slots, slot i with
    lengths[i] rows already in its cache (random), as the runtime binds an N-slot step."""
    feeds = {}
    for i in sess.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = rng.integers(0, 300, (batch, 1)).astype(np.int64)
        elif i.name == "image_embeds":                      # the runtime's placeholder row while decoding
            feeds[i.name] = np.zeros((1, i.shape[1]), np.float32)
        elif i.name == "seqlens_k":
            feeds[i.name] = np.array(lengths, np.int32)     # total length - 1 = the new token's row
        elif i.name == "total_sequence_length":
            feeds[i.name] = np.array(max(lengths) + 1, np.int32)
        elif i.name == "penalty":
            feeds[i.name] = np.full((batch,), 1.08, np.float32)
        elif i.name == "seen":
            feeds[i.name] = (rng.uniform(size=(batch, i.shape[1])) < 0.05).astype(np.float32)
        elif i.name.startswith("past_"):
            feeds[i.name] = rng.standard_normal((batch, *i.shape[1:])).astype(np.float32)
        else:                                               # cos, sin: each slot at its own position
            feeds[i.name] = rng.uniform(-1, 1, (batch, 1, i.shape[2])).astype(np.float32)
    return feeds


@pytest.mark.parametrize("target", ["portable", "cuda"])
def test_fused_step_takes_a_batch_of_slots(fast, target):
    """An N-slot artifact's decode step runs batch N, one token per slot at its own cache length: the fused
    graph computes what the exported one does for every slot (no reshape may assume batch 1)."""
    art, fused = fast["a"], fast[f"a-{target}"]
    rng = np.random.default_rng(11)
    da, db = _session(art / "decoder.onnx"), _session(fused / "decoder.onnx", cuda_ops_expanded=target == "cuda")
    feeds = _step_feeds(da, rng, 3, [4, 9, 2])
    outs = [o.name for o in da.get_outputs()]
    ra, rb = da.run(None, feeds), db.run(outs, feeds)
    for name, x, y in zip(outs, ra, rb):
        assert x.shape == y.shape and x.shape[0] == 3, name
        tol = 0 if name == "next_token" else LOGIT_TOL
        assert np.abs(x.astype(np.float64) - y).max() <= tol, name


def _weights(art, nodes):
    inits = {t.name: t for t in onnx.load(str(art / "vision.onnx"), load_external_data=False).graph.initializer}
    return [inits[n.input[2]] for n in nodes]


@pytest.mark.parametrize("which", ["a", "b"])
def test_fused_artifact_gives_identical_tokens(fast, which):
    """The runtime on the portable-fused artifact: same tokens as on the exported one, same manifest I/O."""
    image = make_image(7, (640, 480))
    o = DecodeOptions(max_new_tokens=16, ignore_stop=True)
    a = OCRModel(fast[which]).recognize(image, task="spotting", options=o)
    b = OCRModel(fast[f"{which}-portable"]).recognize(image, task="spotting", options=o)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 16
    ma, mb = read_manifest(fast[which]), read_manifest(fast[f"{which}-portable"])
    for g in ("vision", "decoder"):
        assert getattr(ma, g).inputs == getattr(mb, g).inputs and getattr(ma, g).outputs == getattr(mb, g).outputs


def test_manifest_records_the_fusions(fast):
    m = read_manifest(fast["a16-cuda"])
    f = m.export["fusion"]
    assert f["target"] == "cuda" and f["version"] == 4 and m.precision == "fp16"
    vis = f["graphs"]["vision"]["passes"]
    assert "attention_qkv" not in vis and "patch_gemm" not in vis and not f["options"]["vision_gemms"]
    passes = f["graphs"]["decoder"]["passes"]
    assert passes["gqa_qk_norm"] == 2 and passes["rope"] == 2 and passes["gate_up"] == 2 and "swiglu" not in passes
    assert f["graphs"]["decoder"]["nodes_after"] < f["graphs"]["decoder"]["nodes_before"]
    assert f["cuda_only_ops"] == ["GroupQueryAttention q_norm_weight/k_norm_weight"]
    assert read_manifest(fast["a-portable"]).export["fusion"]["cuda_only_ops"] == []
    json.dumps(m.export)


def test_fuse_refuses_what_it_cannot_fuse(fast, tmp_path):
    from quantize.cli import main
    from quantize.weight_int8 import build_weight_int8

    with pytest.raises(ValueError, match="already fused"):
        fuse_artifact(fast["a-cuda"], tmp_path / "again")
    build_weight_int8(fast["a"], tmp_path / "w8")
    with pytest.raises(ValueError, match="fuse an FP16 or FP32 artifact"):
        fuse_artifact(tmp_path / "w8", tmp_path / "x")
    with pytest.raises(ValueError, match="target"):
        fuse_artifact(fast["a"], tmp_path / "y", FuseOptions(target="tensorrt"))
    assert main(["fuse", str(tmp_path / "missing"), str(tmp_path / "z")]) == 2


def test_weight_int8_after_fusion_runs_and_tracks(fast, tmp_path):
    """Fuse, then weight-int8 (decoder and vision MatMuls as MatMulNBits): loads on the CPU, picks the same
    first tokens as the fused FP32 artifact and keeps the fusions."""
    from quantize.weight_int8 import build_weight_int8

    w8 = tmp_path / "w8"
    m = build_weight_int8(fast["a-portable"], w8)
    assert m.export["fusion"]["target"] == "portable"
    assert _ops(w8 / "decoder.onnx")["SkipSimplifiedLayerNormalization"] == 3
    assert _ops(w8 / "vision.onnx")["MatMulNBits"] == m.export["weight_int8"]["graphs"]["vision"]["matmuls_quantized"]
    image = make_image(8, (500, 700))
    o = DecodeOptions(max_new_tokens=4, ignore_stop=True)
    a = OCRModel(fast["a-portable"]).recognize(image, options=o)
    b = OCRModel(w8).recognize(image, options=o)
    assert b.token_ids[:2] == a.token_ids[:2]


def test_shared_weights_do_not_hide_the_patterns(ckpt_a, tmp_path):
    """A checkpoint whose norm weights are all equal (as on freshly initialized, random-weight models) is exported
    with one initializer shared through Identity nodes: every pass still fires."""
    import shutil

    from safetensors.numpy import load_file, save_file

    ckpt = tmp_path / "ones"
    shutil.copytree(ckpt_a, ckpt)
    f = next(ckpt.glob("*.safetensors"))
    w = load_file(str(f))
    for k in w:
        if k.endswith("norm.weight") or "layernorm.weight" in k:
            w[k] = np.ones_like(w[k])
    save_file(w, str(f), metadata={"format": "pt"})
    art = _export(ckpt, tmp_path / "art", precision="fp16")
    assert _ops(art / "decoder.onnx")["Identity"] > 0
    m = fuse_artifact(art, tmp_path / "fused", FuseOptions(target="cuda"))
    dec = m.export["fusion"]["graphs"]["decoder"]["passes"]
    assert dec == {"rms_norm": 9, "gqa_qk_norm": 2, "rope": 2, "skip_rms_norm": 3, "lm_head": 1, "gate_up": 2}


def test_fuse_reads_a_reslotted_artifact(fast, tmp_path):
    """`quantize reslot` hard-links the graphs' data files; onnx.load refuses such files ("multiple hard
    links"), so fuse reads the weights itself: the reslotted artifact fuses, keeps its slot count and computes
    what the exported graph does."""
    import os
    import shutil
    import subprocess
    import sys

    src, slots3 = tmp_path / "one", tmp_path / "slots3"      # a copy: reslot links the source's files too
    shutil.copytree(fast["a"], src)
    subprocess.run([sys.executable, "-m", "quantize", "reslot", str(src), str(slots3), "--slots", "3"],
                   check=True, capture_output=True)
    if os.stat(slots3 / "decoder.onnx.data").st_nlink < 2:
        pytest.fail("reslot no longer hard-links the data files: this test then checks nothing")
    r = subprocess.run([sys.executable, "-m", "quantize", "fuse", str(slots3), str(tmp_path / "fused"),
                        "--target", "portable"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    m = read_manifest(tmp_path / "fused")
    assert m.kv.slots == 3 and m.export["fusion"]["target"] == "portable"
    rng = np.random.default_rng(5)
    da, db = _session(fast["a"] / "decoder.onnx"), _session(tmp_path / "fused" / "decoder.onnx")
    assert os.stat(slots3 / "decoder.onnx.data").st_nlink >= 2       # the source artifact was left as it was
    feeds = _decoder_feeds(da, rng, rng.standard_normal((5, da.get_inputs()[1].shape[1])).astype(np.float32))
    for x, y in zip(da.run(None, feeds), db.run([o.name for o in da.get_outputs()], feeds)):
        assert np.abs(x.astype(np.float64) - y).max() <= LOGIT_TOL


def test_an_older_cuda_fusion_with_slots_is_refused(fast, tmp_path):
    """A CUDA-fused artifact from fusion version 2 (its packed-QKV reshapes assumed batch 1) with several slots
    is refused at load with what to do, instead of failing in its first decode step."""
    import json
    import shutil

    from edgeocr.errors import ArtifactError
    from edgeocr.model import OCRModel
    art = tmp_path / "old"
    shutil.copytree(fast["a-cuda"], art)
    raw = json.loads((art / "manifest.json").read_text())
    raw["kv_cache"]["slots"] = 3
    raw["export"]["fusion"]["version"] = 2
    (art / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ArtifactError, match="fuse the exported artifact again"):
        OCRModel(art)



@pytest.mark.parametrize("target", ["portable", "cuda"])
def test_vision_gemms(fast, target, tmp_path):
    """--vision-gemms (FuseOptions(vision_gemms=True)): q, k and v straight from their own MatMuls (no Split),
    the patch embedding one MatMul instead of a Conv (the patch merger's two Convs stay); the vision embeddings
    are the exported graph's (FP32); weight-int8 keeps the patch MatMul at the artifact's precision, as its Conv
    was, and the 8-bit artifact picks the fused one's first tokens."""
    from quantize.weight_int8 import build_weight_int8
    fused = tmp_path / "gemms"
    fuse_artifact(fast["a"], fused, FuseOptions(target=target, vision_gemms=True))
    passes = read_manifest(fused).export["fusion"]["graphs"]["vision"]["passes"]
    assert passes["attention_qkv"] == 2 and passes["patch_gemm"] == 1
    g = onnx.load(str(fused / "vision.onnx"), load_external_data=False).graph
    vis, made_by = Counter(n.op_type for n in g.node), {o: n for n in g.node for o in n.output}
    assert vis["Split"] == 0 and vis["Conv"] == 2
    assert all(made_by[x].op_type == "MatMul" for n in g.node if n.op_type == "MultiHeadAttention"
               for x in n.input[:3])
    pixels = np.random.default_rng(5).standard_normal((1, 3, 1024, 1024)).astype(np.float32)
    va = _session(fast["a"] / "vision.onnx").run(None, {"pixels": pixels})[0]
    vb = _session(fused / "vision.onnx").run(None, {"pixels": pixels})[0]
    assert np.abs(va - vb).max() < VISION_TOL
    if target == "portable":
        w8 = tmp_path / "w8"
        build_weight_int8(fused, w8)
        patch = [n for n in onnx.load(str(w8 / "vision.onnx"), load_external_data=False).graph.node
                 if n.name.endswith("_patch_matmul")]
        assert [n.op_type for n in patch] == ["MatMul"]
        o = DecodeOptions(max_new_tokens=4, ignore_stop=True)
        image = make_image(8, (500, 700))
        assert OCRModel(w8).recognize(image, options=o).token_ids[:2] == \
            OCRModel(fused).recognize(image, options=o).token_ids[:2]


def test_patch_gemm_leaves_other_convs():
    """patch_conv_as_matmul matches only a stride-equals-kernel Conv over a square [1, C, S, S] graph input,
    followed by Reshape [1, C, N] and Transpose (0, 2, 1); a padded Conv, a non-square input and a Reshape with
    -1 are left as they are (and none makes the pass fail)."""
    from onnx import TensorProto, helper

    from quantize.fuse import _onnx_model, patch_conv_as_matmul

    def graph(h, w, pads, n):
        wt = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 2, 2], np.ones(48, np.float32))
        shape = helper.make_tensor("s", TensorProto.INT64, [3], [1, 4, n])
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2], kernel_shape=[2, 2], pads=pads),
                 helper.make_node("Reshape", ["c", "s"], ["r"]),
                 helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1])]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [wt, shape])
        return _onnx_model(helper.make_model(g))

    assert patch_conv_as_matmul(graph(8, 8, [0] * 4, 16)) == 1
    assert patch_conv_as_matmul(graph(8, 8, [1] * 4, 25)) == 0          # padded
    assert patch_conv_as_matmul(graph(4, 16, [0] * 4, 16)) == 0         # 2 x 8 patches: N square, input not
    assert patch_conv_as_matmul(graph(8, 8, [0] * 4, -1)) == 0          # N not static


def test_vision_gemms_from_the_command_line(fast, tmp_path):
    """`python -m quantize fuse --vision-gemms` (and quantize.fuse's own CLI) asks for the vision GEMM passes."""
    from quantize.cli import main
    from quantize.fuse import main as fuse_main
    assert main(["fuse", str(fast["a"]), str(tmp_path / "x"), "--target", "portable", "--vision-gemms"]) == 0
    assert fuse_main([str(fast["a"]), str(tmp_path / "y"), "--target", "portable", "--vision-gemms"]) == 0
    for out in ("x", "y"):
        assert read_manifest(tmp_path / out).export["fusion"]["options"]["vision_gemms"]
        assert _ops(tmp_path / out / "vision.onnx")["Split"] == 0
