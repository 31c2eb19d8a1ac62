"""Checkpoint loading: real on-disk formats, and errors that name the problem."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.numpy import load_file, save_file

from edgeocr.errors import CheckpointError
from quantize.checkpoint import expected_shapes, load_tensors, read_spec, weight_files


def test_nested_tied_single_file(ckpt_a):
    spec = read_spec(ckpt_a)
    assert spec.text.tie_word_embeddings and spec.text.head_dim == 32 and spec.text.num_kv_heads == 2
    assert spec.text.rope_sections == (4, 4, 4, 4) and spec.text.rope_alpha == 1000.0
    assert len(weight_files(ckpt_a)) == 1
    w = load_tensors(ckpt_a, spec)
    assert w["lm_head.weight"] is w["model.embed_tokens.weight"]
    assert spec.tokens.stop_ids == (spec.tokens.eos, spec.tokens.eod)


def test_flat_untied_sharded(ckpt_b):
    cfg = json.loads((ckpt_b / "config.json").read_text())
    assert "text_config" not in cfg and "hidden_size" in cfg          # Tencent's flat layout
    assert len(weight_files(ckpt_b)) > 1                              # sharded with an index
    spec = read_spec(ckpt_b)
    assert not spec.text.tie_word_embeddings and spec.text.num_heads == 6 and spec.text.num_kv_heads == 1
    w = load_tensors(ckpt_b, spec)
    assert "lm_head.weight" in expected_shapes(spec)
    assert (w["lm_head.weight"] != w["model.embed_tokens.weight"]).any()


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_not_a_hunyuan_checkpoint(tmp_path, ckpt_a):
    with pytest.raises(CheckpointError, match="missing config.json"):
        read_spec(tmp_path)
    d = _copy(ckpt_a, tmp_path / "llama")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "llama", ["LlamaForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="expected a HunyuanVL checkpoint"):
        read_spec(d)


def test_missing_and_misshaped_tensors(tmp_path, ckpt_a):
    d = _copy(ckpt_a, tmp_path / "c")
    spec = read_spec(d)
    t = load_file(str(d / "model.safetensors"))
    name = "model.layers.1.self_attn.k_proj.weight"
    good = t.pop(name)
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing tensor.*k_proj"):
        load_tensors(d, spec)
    t[name] = good[:, :-1].copy()
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"k_proj.weight has shape \[64, 63\], expected \[64, 64\]"):
        load_tensors(d, spec)
    (d / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="cannot be read as safetensors"):
        load_tensors(d, spec)
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_tensors(d, spec)


def test_missing_shard_and_tokenizer(tmp_path, ckpt_b):
    d = _copy(ckpt_b, tmp_path / "b")
    shard = weight_files(d)[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"names shard {shard.name}, which is missing"):
        weight_files(d)
    (d / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="missing tokenizer.json"):
        read_spec(d)


def test_bad_config_values(tmp_path, ckpt_a):
    d = _copy(ckpt_a, tmp_path / "c")
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"]["rope_parameters"]["mrope_section"] = [4, 4, 4]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="do not sum to head_dim/2"):
        read_spec(d)
    cfg["text_config"]["rope_parameters"]["mrope_section"] = [4, 4, 4, 4]
    cfg["image_token_id"] = 100000
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="outside the vocabulary"):
        read_spec(d)
    (d / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_spec(d)


def test_export_keeps_tied_weights_once_and_valid_onnx(ckpt_a, art_a):
    """The decoder holds the tied embedding once (no transposed lm_head copy), at the expected size;
    graphs use opset <= 20, explicit IR version and external data."""
    import onnx
    import numpy as np
    spec = read_spec(ckpt_a)
    shapes = expected_shapes(spec)
    dec_params = sum(int(np.prod(s)) for k, s in shapes.items() if k.startswith("model."))
    data = (art_a / "decoder.onnx.data").stat().st_size
    assert dec_params * 4 * 0.97 <= data < dec_params * 4 * 1.02   # small tensors stay inline
    for g in ("vision.onnx", "decoder.onnx"):
        m = onnx.load(str(art_a / g), load_external_data=False)
        assert m.ir_version == 8 and all(o.version <= 20 for o in m.opset_import)
        assert not any(n.op_type in ("ScatterND", "ScatterElements", "TensorScatter") for n in m.graph.node)
    gelu_ok = onnx.load(str(art_a / "vision.onnx"), load_external_data=False)
    assert any(n.op_type == "Erf" for n in gelu_ok.graph.node)        # exact erf GELU, not tanh
    assert oct((art_a / "manifest.json").stat().st_mode & 0o777) == "0o644"
