"""`python -m quantize average`: the weighted mean of two checkpoints of one architecture, on tiny random
HunyuanVL checkpoints (sharded and not), and what it refuses."""

from __future__ import annotations

import json

import pytest
import torch

from edgeocr.errors import CheckpointError
from quantize.average import average
from quantize.checkpoint import weight_files
from quantize.tiny import TINY_A, TINY_B, make_tiny_checkpoint


def _tensors(ckpt) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    out = {}
    for f in weight_files(ckpt):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("avg")
    a = make_tiny_checkpoint(root / "a", TINY_A, seed=1)
    b = make_tiny_checkpoint(root / "b", TINY_A, seed=2, max_shard_size="20KB")     # another shard layout
    for ckpt, fill in ((a, 1.0), (b, 3.0)):
        torch.save({"proj.weight": torch.full((4, 8), fill), "proj.bias": torch.zeros(4)}, ckpt / "glyph_head.pt")
    cfg = json.loads((b / "config.json").read_text())
    cfg["dtype"] = "bfloat16"                                   # a dtype field alone does not make another model
    (b / "config.json").write_text(json.dumps(cfg))
    return a, b


def test_the_mean_of_two_checkpoints(pair, tmp_path):
    a, b = pair
    r = average(a, b, tmp_path / "mean", weight=0.25)
    ta, tb, tm = _tensors(a), _tensors(b), _tensors(tmp_path / "mean")
    assert len(weight_files(b)) > 1 and [f.name for f in weight_files(tmp_path / "mean")] == ["model.safetensors"]
    assert set(tm) == set(ta) and r.tensors == len(ta) and r.parameters == sum(t.numel() for t in ta.values())
    for name, t in tm.items():
        assert t.dtype == ta[name].dtype and t.shape == ta[name].shape
        want = (0.75 * ta[name].float() + 0.25 * tb[name].float()).to(t.dtype)
        assert torch.equal(t, want), name
    assert (tmp_path / "mean" / "config.json").read_text() == (a / "config.json").read_text()
    head = torch.load(tmp_path / "mean" / "glyph_head.pt")
    assert r.glyph_head and torch.equal(head["proj.weight"], torch.full((4, 8), 1.5))
    same = average(a, b, tmp_path / "a-again", weight=0.0)                    # weight 0: A, bit for bit
    assert all(torch.equal(t, ta[n]) for n, t in _tensors(tmp_path / "a-again").items()) and same.glyph_head


def test_refuses_what_cannot_be_averaged(pair, tmp_path):
    a, b = pair
    other = make_tiny_checkpoint(tmp_path / "other", TINY_B, seed=3)
    with pytest.raises(CheckpointError, match="not one architecture: their config.json differ at"):
        average(a, other, tmp_path / "x")
    with pytest.raises(ValueError, match=r"--weight must be within \[0, 1\]"):
        average(a, b, tmp_path / "y", weight=1.5)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(ValueError, match="exists and is not empty"):
        average(a, b, tmp_path / "full")
