"""The runtime against transformers' hunyuan_vl (FP32), token for token and logit for logit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import make_image
from edgeocr import preprocess, prompts, rope, selection
from edgeocr.decode import DecodeOptions
from edgeocr.model import OCRModel

import reference as ref

VISION_TOL = 2e-4     # max abs difference of image embeddings (values of order 1-5)
LOGIT_TOL = 2e-3      # max abs difference of logits (values of order 5-10)
N_STEPS = 10


class Recorder:
    """Delegating Session that keeps a copy of every logits vector the backend returns."""

    def __init__(self, inner):
        self.inner, self.logits = inner, []
        self.name, self.slots, self.cache_len = inner.name, inner.slots, inner.cache_len
        self.vocab_size = inner.vocab_size

    def encode_image(self, pixels, slot=0):
        return self.inner.encode_image(pixels, slot)

    def prefill(self, slot, ids, cos, sin):
        out = self.inner.prefill(slot, ids, cos, sin)
        self.logits.append(out.copy())
        return out

    def step(self, tokens, pos, cos, sin, live):
        out = self.inner.step(tokens, pos, cos, sin, live)
        self.logits.append(out[0].copy())
        return out

    def memory_bytes(self):
        return self.inner.memory_bytes()

    def selection(self):
        from edgeocr.selection import HostSelection
        return HostSelection(self)                      # over the recorded logits


def run_recorded(model: OCRModel, image, task=None, prompt=None, lang="zh", n=N_STEPS):
    rec = Recorder(model.session)
    model.session = rec
    try:
        res = model.recognize(image, task=task, prompt=prompt, lang=lang,
                              options=DecodeOptions(max_new_tokens=n))
    finally:
        model.session = rec.inner
    return res, np.stack(rec.logits)


def runtime_inputs(model: OCRModel, image, task=None, prompt=None, lang="zh"):
    prep = model.prepare(image)
    instruction, _ = model.instruction(task, prompt, lang)
    return prep.pixels, model.prompt_ids(instruction)


@pytest.fixture(scope="module")
def models(art_a, art_b):
    return {"a": OCRModel(art_a), "b": OCRModel(art_b)}


def test_preprocessing_matches_reference_processor():
    """Our letterbox+normalize equals HunYuanVLImageProcessorPil on the letterboxed canvas."""
    from transformers.models.hunyuan_vl.image_processing_pil_hunyuan_vl import HunYuanVLImageProcessorPil

    canvas, lb = preprocess.letterbox(Image.fromarray(make_image(3, (500, 900))))
    assert (lb.new_w, lb.new_h) == (1024, round(500 * 1024 / 900))
    out = HunYuanVLImageProcessorPil(min_pixels=512 * 512, max_pixels=4096 * 4096)(
        images=Image.fromarray(canvas), return_tensors="np")
    assert out["image_grid_thw"].tolist() == [[1, 64, 64]]
    ours = preprocess.patchify(preprocess.normalize(canvas))
    np.testing.assert_allclose(ours, out["pixel_values"], atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_vision_embeddings_match(pair, models, seed):
    ckpt, art = pair
    model = models["a" if art.name == "tiny-a" else "b"]
    pixels, _ = runtime_inputs(model, make_image(seed))
    model.session.encode_image(pixels)
    ours = model.session.image_embeds()
    theirs = ref.image_embeds(ref.load(ckpt), pixels)
    assert ours.shape == theirs.shape == (1058, model.artifact.hidden_size)
    assert np.abs(ours - theirs).max() < VISION_TOL


@pytest.mark.parametrize("seed", [0, 5, 9])
def test_logits_teacher_forced_and_tokens_match(pair, models, seed):
    """Every step's logits (prefill + decode over the generated sequence) match the reference's
    teacher-forced logits, and greedy tokens equal transformers `generate`."""
    ckpt, art = pair
    model = models["a" if art.name == "tiny-a" else "b"]
    image = make_image(seed, (480 + 40 * seed, 900 - 30 * seed))
    res, ours = run_recorded(model, image, task="spotting")
    pixels, ids = runtime_inputs(model, image, task="spotting")
    hf = ref.load(ckpt)
    seq = np.concatenate([ids, np.asarray(res.token_ids[:-1], np.int64)])
    theirs = ref.logits(hf, pixels, seq)[len(ids) - 1:]
    assert ours.shape == theirs.shape
    err = np.abs(ours - theirs).max(axis=1)
    assert err.max() < LOGIT_TOL, f"per-step max |Δlogit| {err}"
    gen = ref.generate(hf, pixels, ids, N_STEPS, model.stop_ids, model.artifact.repetition_penalty)
    assert res.token_ids == gen


@pytest.mark.parametrize("which", ["a", "b"])
def test_gqa_flavour_matches_reference_in_place(which, ckpt_a, ckpt_b, gqa_arts):
    """attention="gqa" (MultiHeadAttention in the vision graph; GroupQueryAttention with present_* bound
    onto past_* in the decoder): same image embeddings, logits at every step and tokens as transformers;
    the cache rows are written by the graph itself (the host copies none)."""
    ckpt = ckpt_a if which == "a" else ckpt_b
    model = OCRModel(gqa_arts[which])
    assert model.artifact.decoder.attention == "gqa" and model.session.inplace
    assert model.artifact.vision.attention == "mha"
    image = make_image(4, (700, 520))
    pixels, _ = runtime_inputs(model, image)
    model.session.encode_image(pixels)                    # fused MultiHeadAttention in the vision graph
    vis = model.session.image_embeds()
    assert np.abs(vis - ref.image_embeds(ref.load(ckpt), pixels)).max() < VISION_TOL
    res, ours = run_recorded(model, image, task="spotting")
    pixels, ids = runtime_inputs(model, image, task="spotting")
    hf = ref.load(ckpt)
    seq = np.concatenate([ids, np.asarray(res.token_ids[:-1], np.int64)])
    theirs = ref.logits(hf, pixels, seq)[len(ids) - 1:]
    err = np.abs(ours - theirs).max(axis=1)
    assert err.max() < LOGIT_TOL, f"per-step max |Δlogit| {err}"
    assert res.token_ids == ref.generate(hf, pixels, ids, N_STEPS, model.stop_ids,
                                         model.artifact.repetition_penalty)
    # the graph filled exactly prompt + generated - 1 rows of every layer's cache, in place
    filled = len(ids) + len(res.token_ids) - 1
    k0 = model.session.keys[0].host
    assert np.abs(k0[:, :, :filled]).sum(axis=(0, 1, 3)).min() > 0 and not k0[:, :, filled:].any()


@pytest.mark.parametrize("task,lang", [(t, "zh") for t in prompts.task_names()]
                         + [(t, "en") for t in sorted(prompts.TASKS_EN)])
def test_every_task_prompt_matches_generate(ckpt_a, models, task, lang):
    model = models["a"]
    image = make_image(11)
    res, ours = run_recorded(model, image, task=task, lang=lang, n=6)
    pixels, ids = runtime_inputs(model, image, task=task, lang=lang)
    hf = ref.load(ckpt_a)
    seq = np.concatenate([ids, np.asarray(res.token_ids[:-1], np.int64)])
    assert np.abs(ours - ref.logits(hf, pixels, seq)[len(ids) - 1:]).max() < LOGIT_TOL
    assert res.token_ids == ref.generate(hf, pixels, ids, 6, model.stop_ids, model.artifact.repetition_penalty)


def test_custom_prompt_matches(ckpt_b, models):
    model = models["b"]
    image = make_image(4)
    res, ours = run_recorded(model, image, prompt="Output the value of Total.", n=5)
    pixels, ids = runtime_inputs(model, image, prompt="Output the value of Total.")
    seq = np.concatenate([ids, np.asarray(res.token_ids[:-1], np.int64)])
    assert np.abs(ours - ref.logits(ref.load(ckpt_b), pixels, seq)[len(ids) - 1:]).max() < LOGIT_TOL


def test_logit_check_is_sensitive(ckpt_a, art_a, models):
    """The tolerance is meaningful: a wrong rope layout or another image moves logits past it."""
    model = models["a"]
    image = make_image(0)
    pixels, ids = runtime_inputs(model, image, task="spotting")
    theirs = ref.logits(ref.load(ckpt_a), pixels, ids)[-1]
    _, good = run_recorded(model, image, task="spotting", n=1)
    assert np.abs(good[0] - theirs).max() < LOGIT_TOL
    wrong_layout = OCRModel(art_a, rope_layout="A")
    _, bad = run_recorded(wrong_layout, image, task="spotting", n=1)
    assert np.abs(bad[0] - theirs).max() > 20 * LOGIT_TOL
    _, other = run_recorded(model, make_image(1), task="spotting", n=1)
    assert np.abs(other[0] - theirs).max() > 20 * LOGIT_TOL


def test_streaming_equals_batch(models):
    model = models["a"]
    image = make_image(2)
    stream = model.stream(image, task="structured_parse", options=DecodeOptions(max_new_tokens=8))
    events = list(stream)
    streamed = stream.result
    batch = model.recognize(image, task="structured_parse", options=DecodeOptions(max_new_tokens=8))
    assert [t for t, _ in events] == batch.token_ids == streamed.token_ids
    from edgeocr.result import drop_cut_character
    assert "".join(d for _, d in events) == drop_cut_character(model.tokenizer.decode(batch.token_ids),
                                                               batch.token_ids, model.tokenizer, batch.finish_reason)
    seen = []
    cb = model.recognize(image, task="structured_parse", options=DecodeOptions(max_new_tokens=8),
                         on_token=lambda t, d: seen.append(t))
    assert seen == cb.token_ids == batch.token_ids


# ------------------------------------------------- pure functions against their transformers counterparts
def test_position_ids_match_transformers_get_rope_index(ckpt_a):
    hf = ref.load(ckpt_a)
    cfg = hf.config
    img = cfg.image_token_id
    # grid (1, 4, 6) -> 2x3 merged grid + newline column -> 8 grid tokens + begin/end = 10 slots
    ids = torch.tensor([[1, 2, 3] + [img] * 10 + [4, 5, 6, 7]])
    pos, _ = hf.model.get_rope_index(ids, (ids == img).int(), torch.tensor([[1, 4, 6]]))
    ours = rope.position_ids(ids.shape[1], 3, (4, 6), 2)
    np.testing.assert_array_equal(ours, pos[:, 0].numpy())
    # spec §4.2 worked example (axis w)
    assert ours[1, 3:13].tolist() == [3, 0, 1, 2, 3, 0, 1, 2, 3, 12]


def test_cos_sin_match_transformers_rotary(ckpt_a):
    hf = ref.load(ckpt_a)
    tc = hf.config.text_config
    rot = hf.model.language_model.rotary_emb
    pos = rope.position_ids(40, 5, (8, 8), 2)
    cos_ref, sin_ref = rot(torch.zeros(1, dtype=torch.float32), torch.from_numpy(pos)[:, None, :])
    freqs = rope.inv_freq(tc.head_dim, tc.rope_parameters["rope_theta"], tc.rope_parameters["alpha"])
    np.testing.assert_allclose(freqs, rot.inv_freq.numpy(), rtol=1e-6)
    cos, sin = rope.cos_sin(pos, freqs, tuple(tc.rope_parameters["mrope_section"]), "B")
    np.testing.assert_allclose(cos, cos_ref[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(sin, sin_ref[0].numpy(), atol=1e-5)


def test_repetition_penalty_matches_hf_processor():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(50).astype(np.float32) * 3
    ids = np.array([3, 7, 7, 11, 49, 0])
    ours = selection.RepetitionPenalty(50, 1.08, ids)(logits.copy())
    theirs = RepetitionPenaltyLogitsProcessor(1.08)(torch.from_numpy(ids)[None], torch.from_numpy(logits)[None])
    np.testing.assert_allclose(ours, theirs[0].numpy(), rtol=1e-6)
    rp = selection.RepetitionPenalty(50, 1.08, ids)
    rp.add(20)
    rp.add(20)
    assert sorted(rp.ids.tolist()) == [0, 3, 7, 11, 20, 49]
