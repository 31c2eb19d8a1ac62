"""Shared fixtures: tiny random-weight HunyuanVL checkpoints (made with transformers' own
`hunyuan_vl`) and the artifacts exported from them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from quantize.tiny import TINY_A, TINY_B, make_tiny_checkpoint

CACHE_LEN = 1536
PREFILL_LEN = 1400
DEMO = Path(__file__).resolve().parents[1] / "demo_model"


@pytest.fixture(scope="session")
def ckpt_a(tmp_path_factory):
    """tiny-a: GQA 2, head_dim 32 != 64/4, 2 layers, tied lm_head, nested config, one safetensors file."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-a", TINY_A, seed=1)


@pytest.fixture(scope="session")
def ckpt_b(tmp_path_factory):
    """tiny-b: GQA 6, head_dim 24 != 96/6, 3 layers, stored lm_head, flat config, sharded weights."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-b", TINY_B, seed=2, flat_config=True,
                                max_shard_size="300KB")


def _export(ckpt, out, **kw):
    from quantize.export import ExportOptions, export
    export(ckpt, out, ExportOptions(cache_len=CACHE_LEN, prefill_len=PREFILL_LEN, **kw))
    return out


@pytest.fixture(scope="session")
def art_a(ckpt_a, tmp_path_factory):
    return _export(ckpt_a, tmp_path_factory.mktemp("art") / "tiny-a")


@pytest.fixture(scope="session")
def art_b(ckpt_b, tmp_path_factory):
    return _export(ckpt_b, tmp_path_factory.mktemp("art") / "tiny-b")


@pytest.fixture(scope="session")
def gqa_arts(ckpt_a, ckpt_b, tmp_path_factory):
    """Both tiny configs exported with attention="gqa" (ONNX Runtime GroupQueryAttention, in-place cache)."""
    root = tmp_path_factory.mktemp("art-gqa")
    return {"a": _export(ckpt_a, root / "tiny-a", attention="gqa"), "b": _export(ckpt_b, root / "tiny-b", attention="gqa")}


@pytest.fixture(scope="session", params=["a", "b"])
def pair(request, ckpt_a, ckpt_b, art_a, art_b):
    """(checkpoint, artifact) for both tiny configs."""
    return (ckpt_a, art_a) if request.param == "a" else (ckpt_b, art_b)


@pytest.fixture(scope="session")
def demo_arts(tmp_path_factory):
    """The demo model's artifacts of every flavour (cache 1,536, prefill 1,280): "masked" (FP32, masked
    attention over the static cache), "fp32" (FP32 GroupQueryAttention + selection in the graph, fused for
    portable ONNX Runtime: the CPU chain's base) and "cpu8" (`weight-int8 --target cpu` of "fp32")."""
    from quantize.export import ExportOptions, export
    from quantize.fuse import FuseOptions, fuse_artifact
    from quantize.weight_int8 import build_cpu

    root = tmp_path_factory.mktemp("demo-arts")
    export(DEMO, root / "masked", ExportOptions(cache_len=1536, prefill_len=1280))
    export(DEMO, root / "gqa", ExportOptions(cache_len=1536, prefill_len=1280, attention="gqa", select_on_device=True))
    fuse_artifact(root / "gqa", root / "fp32", FuseOptions(target="portable"))
    build_cpu(root / "fp32", root / "cpu8")
    return {"masked": root / "masked", "fp32": root / "fp32", "cpu8": root / "cpu8"}


def make_image(seed: int, size=(600, 800)) -> np.ndarray:
    """Deterministic RGB uint8 image with structure (blocks, lines), HxWx3."""
    rng = np.random.default_rng(seed)
    h, w = size
    img = np.full((h, w, 3), 255, np.uint8)
    for _ in range(12):
        y, x = rng.integers(0, h - 40), rng.integers(0, w - 120)
        img[y:y + rng.integers(8, 40), x:x + rng.integers(30, 120)] = rng.integers(0, 200, 3)
    img += rng.integers(0, 20, img.shape, dtype=np.uint8)
    return img
