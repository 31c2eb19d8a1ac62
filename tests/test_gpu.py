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
    ort = pytest.importorskip("onnxruntime")
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
    assert g.session.inplace and not g.session.step_news
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
    plain, graph = OCRModel(art, device="cuda"), OCRModel(art, device="cuda", cuda_graph=True)
    for seed in (6, 7):
        o = DecodeOptions(max_new_tokens=40, repetition_penalty=1.3)
        assert plain.recognize(make_image(seed), options=o).token_ids == graph.recognize(make_image(seed), options=o).token_ids
