"""`edgeocr build-engines` with TensorRT-RTX, which builds engines ahead of time without a GPU: real engines from
the tiny artifacts (FP32 and INT8 with explicit Q/DQ) on this CPU-only machine, the recorded build
report, and the version/GPU guard.  Running the engines needs an RTX GPU (TensorRT-RTX) or full TensorRT."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgeocr.errors import BackendError
from edgeocr.trt_engines import BuildOptions, build, check_compatible, import_trt

CALIB = Path(__file__).resolve().parents[1] / "calibration_data" / "calib"


def _copy(art, tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(art, dst)
    return dst


def test_build_fp32_engines_via_cli(art_a, tmp_path):
    art = _copy(art_a, tmp_path, "a")
    r = subprocess.run([sys.executable, "-m", "edgeocr", "build-engines", str(art), "--flavour", "tensorrt_rtx"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rec = json.loads((art / "engines.json").read_text())
    trt, _ = import_trt("tensorrt_rtx")
    assert rec["flavour"] == "tensorrt_rtx" and rec["tensorrt_version"] == trt.__version__
    for g in ("vision", "decoder"):
        e = rec["engines"][g]
        assert (art / e["file"]).stat().st_size == e["bytes"] > 100_000
        assert e["qdq_layers"] == 0 and e["network_layers"] > 50
        # no GPU here: the layer list is missing, and why is said in TensorRT's own words
        assert not e["engine_layers"]["available"]
        assert e["engine_layers"]["reason"].startswith("the engine does not load on this machine: ")
        assert "Error Code" in e["engine_layers"]["reason"]
    # one static vision profile; prefill (S up to max_prefill, all image rows) and decode (S = 1) profiles
    assert len(rec["engines"]["vision"]["profiles"]) == 1
    pre, dec = rec["engines"]["decoder"]["profiles"]
    assert pre["input_ids"][2] == [1, 1400] and dec["input_ids"] == [[1, 1]] * 3
    assert "decoder.engine" in r.stdout


def test_build_int8_engines_keep_the_qdq(art_a, tmp_path):
    from quantize.int8 import Int8Options, build_int8
    art = tmp_path / "int8"
    import onnx
    build_int8(art_a, CALIB, art, Int8Options(calib_images=6, holdout_images=2, decode_tokens=6))
    rec = build(art, BuildOptions(flavour="tensorrt_rtx"), progress=lambda _: None)
    assert rec["precision"] == "int8"
    for g in ("vision", "decoder"):
        ops = [n.op_type for n in onnx.load(str(art / f"{g}.onnx"), load_external_data=False).graph.node]
        n_dq = ops.count("DequantizeLinear")
        assert n_dq > 0 and rec["engines"][g]["network_layer_types"]["DEQUANTIZE"] == n_dq   # every Q/DQ parsed


def test_gqa_flavour_is_refused_with_the_fix(gqa_arts):
    with pytest.raises(BackendError, match="--attention masked"):
        build(gqa_arts["a"], BuildOptions(flavour="tensorrt_rtx"))


def test_version_and_gpu_guard():
    rec = {"flavour": "tensorrt", "tensorrt_version": "10.3.0", "gpu": {"name": "Orin", "compute_capability": "8.7"}}
    check_compatible(rec, "10.3.0", {"name": "Orin", "compute_capability": "8.7"})
    with pytest.raises(BackendError, match="rebuild them here"):
        check_compatible(rec, "10.7.0", {"name": "Orin", "compute_capability": "8.7"})
    with pytest.raises(BackendError, match="rebuild them here"):
        check_compatible(rec, "10.3.0", {"name": "NVIDIA GeForce RTX 4090 D", "compute_capability": "8.9"})
    with pytest.raises(BackendError, match="unknown TensorRT flavour"):
        import_trt("tensorrt-llm")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_trt_buffer_plan_binds_every_tensor_once(precision, art_a, ckpt_a, tmp_path):
    """The TensorRT session's device-buffer plan, from the manifest: every engine tensor of every context
    is bound, shapes and dtypes agree with the graphs (FP16: the vision graph's FP16 embeddings are the
    buffer the prefill reads), the caches and the image rows are shared where contexts meet, and the KV
    bytes are what the manifest says.  (The session itself cannot run here: no GPU.)"""
    from edgeocr.backends.tensorrt import plan_buffers
    from edgeocr.artifact import read as read_manifest
    from quantize.export import ExportOptions, export
    if precision == "fp16":
        art_a = tmp_path / "fp16"
        export(ckpt_a, art_a, ExportOptions(precision="fp16", cache_len=1536, prefill_len=1400))
    m = read_manifest(art_a)
    plan = plan_buffers(m)
    io = {g: {t["name"]: (t["shape"], t["dtype"]) for t in getattr(m, g).inputs + getattr(m, g).outputs}
          for g in ("vision", "decoder")}
    assert set(plan.bindings["vision"]) == set(io["vision"])
    for ctx, g in (("vision", "vision"), ("prefill", "decoder"), ("decode", "decoder")):
        assert set(plan.bindings[ctx]) == set(io[g]), ctx
        for tensor, buf in plan.bindings[ctx].items():
            (want, dtype), have = io[g][tensor], plan.buffers[buf]
            assert len(want) == len(have.shape) and dtype == have.dtype, (ctx, tensor)
            assert all(w == h for w, h in zip(want, have.shape) if isinstance(w, int)), (ctx, tensor)
    assert plan.buffers["image_embeds"].dtype == ("float16" if precision == "fp16" else "float32")
    pre, dec = plan.bindings["prefill"], plan.bindings["decode"]
    assert all(pre[f"past_key_{i}"] == dec[f"past_key_{i}"] for i in range(m.kv.layers))
    assert plan.bindings["vision"]["image_embeds"] == pre["image_embeds"] != dec["image_embeds"]
    assert pre["new_key_0"] != dec["new_key_0"] and pre["logits"] == dec["logits"]
    kv = sum(b.nbytes for n, b in plan.buffers.items() if n.startswith("cache_"))
    assert kv == m.kv.bytes_per_token * m.kv.cache_len == m.kv.bytes
    assert plan.fixed_shapes["decode"]["input_ids"] == (1, 1)


def test_trt_session_without_engines_says_build(art_a, caplog):
    """Opening the TensorRT session says it is experimental (it has not run on a GPU yet), then what is missing."""
    from edgeocr.backends.tensorrt import EXPERIMENTAL
    from edgeocr.model import OCRModel
    with caplog.at_level("WARNING", logger="edgeocr"):
        with pytest.raises(BackendError, match="edgeocr build-engines"):
            OCRModel(art_a, backend="tensorrt", device="cuda")
    assert [r.getMessage() for r in caplog.records] == [EXPERIMENTAL] and "experimental" in EXPERIMENTAL
    caplog.clear()
    with caplog.at_level("WARNING", logger="edgeocr"):
        with pytest.raises(BackendError, match="device='cuda'"):
            OCRModel(art_a, backend="tensorrt", device="cpu")
        OCRModel(art_a)                                    # ONNX Runtime: no such warning
    assert [r.getMessage() for r in caplog.records] == [EXPERIMENTAL]


def test_run_serve_bench_offer_onnx_runtime_only():
    """Until the TensorRT session has run on a GPU, the commands do not offer it: no --backend flag."""
    from edgeocr.cli import main
    for cmd in (["run", "x.png", "--model", "m"], ["bench", "m"], ["serve"]):
        with pytest.raises(SystemExit) as e:
            main([*cmd, "--backend", "tensorrt"])
        assert e.value.code == 2, cmd


def test_build_fp16_engines(ckpt_a, tmp_path):
    """An FP16 artifact (image embeddings FP16 end to end) gives FP16 engines: strongly typed, so the
    network's tensors keep the graph's FP16; the image buffer the session shares is FP16 on both sides."""
    from edgeocr.backends.tensorrt import plan_buffers
    from edgeocr.artifact import read as read_manifest
    from quantize.export import ExportOptions, export
    art = tmp_path / "fp16"
    export(ckpt_a, art, ExportOptions(precision="fp16", cache_len=1536, prefill_len=1400))
    rec = build(art, BuildOptions(flavour="tensorrt_rtx"), progress=lambda _: None)
    assert rec["precision"] == "fp16"
    for g in ("vision", "decoder"):
        e = rec["engines"][g]
        assert (art / e["file"]).stat().st_size == e["bytes"] > 50_000 and e["qdq_layers"] == 0
    assert plan_buffers(read_manifest(art)).buffers["image_embeds"].dtype == "float16"
