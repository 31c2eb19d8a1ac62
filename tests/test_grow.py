"""`python -m quantize grow`: the deeper checkpoint computes exactly what its source computes, keeps its format,
and is read by the project's loader, the exporter and the trainer."""

from __future__ import annotations

import difflib
import filecmp
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors import safe_open

from conftest import DEMO, make_image
from quantize import reference as ref
from quantize.checkpoint import load_tensors, read_spec, weight_files
from quantize.grow import GrowOptions, grow, layer_plan

EVAL_PAGE = DEMO.parent / "calibration_data" / "eval" / "000000.jpg"
STEPS = 16


def quantize_cli(*args):
    return subprocess.run([sys.executable, "-m", "quantize", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def tensors(ckpt) -> dict[str, torch.Tensor]:
    out = {}
    for f in weight_files(ckpt):
        with safe_open(str(f), framework="pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})
    return out


@pytest.fixture(scope="module")
def grown_demo(tmp_path_factory):
    """demo_model (6 decoder and 6 vision layers) grown to 8 and 8 by the command line: (OUT, its stdout)."""
    out = tmp_path_factory.mktemp("grow") / "demo-8-8"
    p = quantize_cli("grow", DEMO, out, "--text-layers", 8, "--vision-layers", 8)
    assert p.returncode == 0, p.stderr
    return out, p.stdout


def test_layer_plan_spreads_new_layers_evenly():
    N = None
    assert layer_plan(4, 6) == [0, N, 1, 2, N, 3]
    assert layer_plan(4, 8) == [0, N, 1, N, N, 2, N, 3]
    assert layer_plan(4, 4) == [0, 1, 2, 3]
    assert layer_plan(1, 3) == [0, N, N]
    assert layer_plan(2, 3) == [0, N, 1]
    for old in range(2, 9):
        for new in range(old, 30):
            plan = layer_plan(old, new)
            kept = [i for i in plan if i is not None]
            assert kept == list(range(old)) and plan[0] == 0 and plan[-1] == old - 1
            where = [plan.index(i) for i in range(old)]
            gaps = [b - a - 1 for a, b in zip(where, where[1:])]
            assert sum(gaps) == new - old and max(gaps) - min(gaps) <= 1
    with pytest.raises(ValueError):
        layer_plan(4, 3)


def test_grown_demo_model_gives_the_same_logits_and_tokens(grown_demo):
    """One real eval page through the project's preprocessing and prompt: the 16 greedy steps' logits and tokens
    of transformers' model (FP32, CPU; sdpa, the faster CPU attention) are those of demo_model."""
    out, _ = grown_demo
    runs = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)       # bit for bit: one thread's reduction order (with several threads, cores taken
    try:                           # by other work may change how a reduction is split)
        for ckpt in (DEMO, out):
            runs[ckpt] = _greedy_with_logits(ckpt)
    finally:
        torch.set_num_threads(threads)
    (tok_a, log_a), (tok_b, log_b) = runs[DEMO], runs[out]
    assert len(tok_a) == STEPS and tok_b == tok_a
    assert torch.equal(log_b, log_a)                     # a new layer adds exactly 0.0: bit-identical logits


def _greedy_with_logits(ckpt):
    """transformers' greedy steps on the eval page: (tokens [steps], logits [steps, V] float32)."""
    r = ref.TransformersRunner(str(ckpt), attn="sdpa")
    lm, vt = r.model.model.language_model, r.model.model.vision_tower
    assert (len(lm.layers), len(vt.layers)) == ((6, 6) if ckpt == DEMO else (8, 8))
    pixels, ids, _ = r.page(EVAL_PAGE)
    with torch.no_grad():
        g = r.model.generate(**ref.inputs(r.model, pixels, ids), max_new_tokens=STEPS, do_sample=False,
                             repetition_penalty=r.penalty, eos_token_id=r.stop_ids, pad_token_id=r.stop_ids[0],
                             output_logits=True, return_dict_in_generate=True)
    return g.sequences[0, len(ids):].tolist(), torch.cat(g.logits).float()   # [steps], [steps, V]


def test_new_layers_copy_their_neighbour_with_zeroed_residual_writers(grown_demo):
    out, _ = grown_demo
    src, dst = tensors(DEMO), tensors(out)
    assert len(dst) == len(src) + 2 * 11 + 2 * 16            # 11 tensors a decoder layer, 16 a vision block
    writers = {"model.layers": ("self_attn.o_proj.weight", "mlp.down_proj.weight"),
               "vit.layers": ("self_attn.o_proj.weight", "self_attn.o_proj.bias", "mlp.dense_4h_to_h.weight",
                              "mlp.dense_4h_to_h.bias")}
    for prefix, zeroed in writers.items():
        for k, i in enumerate([0, 1, None, 2, 3, None, 4, 5]):
            names = sorted(n for n in src if n.startswith(f"{prefix}.{0 if i is None else i}."))
            for n in names:
                suffix = n.split(".", 3)[3]
                new = dst[f"{prefix}.{k}.{suffix}"]
                assert new.dtype == torch.bfloat16
                if i is None and suffix in zeroed:
                    assert not new.any(), f"{prefix}.{k}.{suffix}"
                elif i is None:               # a copy of the SRC layer before it (1 before 2, 3 before 5)
                    assert torch.equal(new, src[f"{prefix}.{plan_before(k)}.{suffix}"])
                else:
                    assert torch.equal(new, src[n])
    rest = [n for n in src if not n.startswith(tuple(writers))]
    assert all(torch.equal(dst[n], src[n]) for n in rest)


def plan_before(k: int) -> int:
    """The SRC layer before OUT layer k in layer_plan(6, 8)."""
    return [i for i in layer_plan(6, 8)[:k] if i is not None][-1]


def test_grown_demo_keeps_the_format_and_loads(grown_demo):
    out, stdout = grown_demo
    assert {p.name for p in out.iterdir()} == {p.name for p in DEMO.iterdir()}
    for p in DEMO.iterdir():
        if p.name not in ("config.json", "model.safetensors"):
            assert filecmp.cmp(p, out / p.name, shallow=False), p.name
    a = (DEMO / "config.json").read_text().splitlines()
    b = (out / "config.json").read_text().splitlines()
    changed = [line for line in difflib.unified_diff(a, b, lineterm="", n=0) if line[:1] in "+-"][2:]
    assert changed == ['-    "num_hidden_layers": 6,', '+    "num_hidden_layers": 8,'] * 2    # text, vision
    ca, cb = json.loads((DEMO / "config.json").read_text()), json.loads((out / "config.json").read_text())
    cb["text_config"]["num_hidden_layers"] = cb["vision_config"]["num_hidden_layers"] = 6
    assert ca == cb
    with safe_open(str(DEMO / "model.safetensors"), "pt") as h1, safe_open(str(out / "model.safetensors"), "pt") as h2:
        assert h1.metadata() == h2.metadata()
    assert (out / "model.safetensors").stat().st_mode == (DEMO / "model.safetensors").stat().st_mode

    spec = read_spec(out)                                       # the project's loader: every name and shape
    assert (spec.text.num_layers, spec.vision.num_layers) == (8, 8)
    assert spec.tokens == read_spec(DEMO).tokens
    load_tensors(out, spec)

    lines = stdout.splitlines()
    size = (out / "model.safetensors").stat().st_size / 2**20
    assert any(line.startswith("parameters") and "7,763,648 -> 9,587,904" in line for line in lines), stdout
    assert any(line.startswith("safetensors") and f"-> {size:.2f} MiB" in line for line in lines), stdout
    assert any("decoder layers" in line and "0 1 + 2 3 + 4 5" in line for line in lines), stdout
    assert any("OVER the shipped model's 16 MiB" in line for line in lines), stdout      # 18.3 MiB


def test_trainer_init_loads_the_grown_model_with_the_same_loss(grown_demo, tmp_path):
    """`python -m quantize train --init OUT` loads through make_model; its batched forward gives SRC's loss."""
    from tokenizers import Tokenizer

    from edgeocr import prompts
    from quantize.tokenizer_build import special_ids
    from quantize.train.config import TrainConfig
    from quantize.train.forward import IGNORE, BatchedHunYuanVL
    from quantize.train.model import make_model

    out, _ = grown_demo
    tok = Tokenizer.from_file(str(DEMO / "tokenizer.json"))
    ids = special_ids(tok)
    canvas = 256                                              # a 16 x 16 patch grid keeps the test quick
    n_img = (canvas // 32) * (canvas // 32 + 1) + 2
    pt = prompts.PromptTokens(bos=ids["bos_token_id"], system_sep=ids["system_sep_token_id"],
                              im_start=ids["im_start_id"], im_end=ids["im_end_id"], image=ids["image_token_id"],
                              user=ids["user_token_id"])
    p = prompts.build_prompt_ids(pt, n_img, tok.encode(prompts.task_prompt("structured_parse")).ids)
    g = torch.Generator().manual_seed(0)
    answer = torch.randint(10, 2000, (2, 12), generator=g)
    input_ids = torch.cat([torch.tensor([p, p]), answer], dim=1)
    labels = torch.cat([torch.full((2, len(p)), IGNORE), answer], dim=1)
    pixels = torch.randn(2, 3, canvas, canvas, generator=g)
    res = []
    for ckpt in (DEMO, out):
        model, _ = make_model(TrainConfig(), tmp_path / ckpt.name, init=ckpt)
        assert len(model.model.language_model.layers) == (6 if ckpt == DEMO else 8)
        assert len(model.model.vision_tower.layers) == (6 if ckpt == DEMO else 8)
        with torch.no_grad():
            res.append(BatchedHunYuanVL(model.eval(), image_start=p.index(ids["image_token_id"]), canvas=canvas)(
                input_ids, labels, pixels, first=len(p) - 1))
    assert torch.equal(res[1].logits, res[0].logits) and torch.equal(res[1].loss, res[0].loss)
    assert res[0].loss > 0.1


def test_fresh_init_on_a_flat_sharded_untied_checkpoint(ckpt_b, tmp_path):
    """tiny-b (flat config, 300 KB shards, stored lm_head, one vision layer), grown with fresh new layers: the
    index is rewritten, the logits are unchanged, and the new layers are in the computation (a non-zero
    residual writer changes the logits)."""
    out = tmp_path / "grown"
    r = grow(ckpt_b, out, GrowOptions(text_layers=5, vision_layers=3, init="fresh", seed=3))
    assert r.text_plan == (0, None, 1, None, 2) and r.vision_plan == (0, None, None)
    assert r.params_after > r.params_before and r.weight_bytes_after > r.weight_bytes_before
    src_index = json.loads((ckpt_b / "model.safetensors.index.json").read_text())
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(src_index["weight_map"].values())
    dst = tensors(out)
    assert set(index["weight_map"]) == set(dst)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in dst.values())
    assert index["metadata"]["total_parameters"] == \
        src_index["metadata"]["total_parameters"] + r.params_after - r.params_before
    cfg = json.loads((out / "config.json").read_text())
    assert "text_config" not in cfg and cfg["num_hidden_layers"] == 5 and cfg["vision_config"]["num_hidden_layers"] == 3
    load_tensors(out, read_spec(out))

    q_new, q_old = dst["model.layers.1.self_attn.q_proj.weight"], dst["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(q_new, q_old) and 0.015 < q_new.float().std() < 0.025       # N(0, 0.02)
    assert torch.equal(dst["model.layers.1.input_layernorm.weight"], torch.ones_like(q_new[0]))
    assert not dst["model.layers.3.mlp.down_proj.weight"].any()
    assert not dst["vit.layers.2.mlp.dense_4h_to_h.bias"].any()
    grow(ckpt_b, tmp_path / "again", GrowOptions(text_layers=5, vision_layers=3, init="fresh", seed=3))
    assert all(filecmp.cmp(f, tmp_path / "again" / f.name, shallow=False) for f in weight_files(out))

    def page_logits(runner):
        pixels, ids, _ = runner.page(make_image(0))
        return ref.logits(runner.model, pixels, ids)                                   # [L, V]

    base = page_logits(ref.TransformersRunner(str(ckpt_b), attn="sdpa"))
    grown = ref.TransformersRunner(str(out), attn="sdpa")
    np.testing.assert_array_equal(page_logits(grown), base)
    m = grown.model.model
    for w in (m.language_model.layers[3].mlp.down_proj.weight, m.vision_tower.layers[2].self_attn.o_proj.bias):
        with torch.no_grad():
            w.normal_()
        assert np.abs(page_logits(grown) - base).max() > 1e-3
        with torch.no_grad():
            w.zero_()


def test_glyph_head_is_copied_and_still_fits(ckpt_a, tmp_path):
    from quantize.checkpoint import GLYPH_HEAD
    from quantize.train.glyph import GlyphHead, load_glyph_head, save_glyph_head

    src = tmp_path / "src"
    shutil.copytree(ckpt_a, src)
    hidden = json.loads((src / "config.json").read_text())["text_config"]["hidden_size"]
    save_glyph_head(GlyphHead(hidden, charset=10, grid=8), src)
    r = grow(src, tmp_path / "out", GrowOptions(vision_layers=4))
    assert r.text_plan == (0, 1) and r.vision_plan == (0, None, None, 1)
    assert filecmp.cmp(src / GLYPH_HEAD, tmp_path / "out" / GLYPH_HEAD, shallow=False)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert load_glyph_head(GlyphHead(cfg["text_config"]["hidden_size"], charset=10, grid=8), tmp_path / "out")
    assert r.disk_bytes_after == sum(p.stat().st_size for p in (tmp_path / "out").iterdir() if p.name != GLYPH_HEAD)


def test_grown_tiny_checkpoint_exports(ckpt_a, tmp_path):
    from quantize.export import ExportOptions, export

    grow(ckpt_a, tmp_path / "ckpt", GrowOptions(text_layers=3))
    m = export(tmp_path / "ckpt", tmp_path / "art", ExportOptions(cache_len=256, prefill_len=128))
    assert m.kv.layers == 3
    assert json.loads((tmp_path / "art" / "manifest.json").read_text())["model"]["vision"]["num_layers"] == 2


def test_refusals(tmp_path):
    p = quantize_cli("grow", DEMO, tmp_path / "out", "--text-layers", 3, "--vision-layers", 8)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--text-layers 3" in p.stderr and "SRC's 6 decoder layers" in p.stderr
    assert not (tmp_path / "out").exists()

    from quantize.cli import main
    for argv, words in (([], ("--text-layers 6", "--vision-layers 6", "equal")),
                        (["--text-layers", "6"], ("--text-layers 6", "--vision-layers 6", "equal")),
                        (["--vision-layers", "2"], ("--vision-layers 2", "SRC's 6 vision-encoder layers"))):
        with pytest.raises(ValueError) as e:
            grow(DEMO, tmp_path / "out", GrowOptions(**{k.lstrip("-").replace("-", "_"): int(v)
                                                       for k, v in zip(argv[::2], argv[1::2])}))
        assert all(w in str(e.value) for w in words), str(e.value)
        assert main(["grow", str(DEMO), str(tmp_path / "out"), *argv]) == 2
    assert main(["grow", str(DEMO), str(tmp_path / "out"), "--text-layers", "7", "--seed", "1"]) == 2   # copy: no draws
    assert not (tmp_path / "out").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ValueError, match="not an empty folder"):
        grow(DEMO, tmp_path / "full", GrowOptions(text_layers=7))
    with pytest.raises(ValueError, match="not an empty folder"):
        grow(DEMO, DEMO, GrowOptions(text_layers=7))
