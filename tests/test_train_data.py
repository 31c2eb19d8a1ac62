"""The trainer's data path on CPU: page pool (generated + a labelled folder), on-device batches, shifts that
keep spotting boxes and glyph targets consistent with the pixels."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pool_setup(tmp_path_factory):
    from tokenizers import Tokenizer

    from quantize.tokenizer_build import special_ids
    from quantize.train.pool import PoolSpec, build_pool

    tmp = tmp_path_factory.mktemp("pool")
    folder = tmp / "html_pages"                       # a folder in the calibration_data label format
    folder.mkdir()
    recs = [json.loads(x) for x in (ROOT / "calibration_data/eval/labels.jsonl").read_text().splitlines()[:2]]
    for k, rec in enumerate(recs):
        name = f"{k:06d}.jpg"
        shutil.copyfile(ROOT / "calibration_data/eval" / rec["image"], folder / name)
        rec = {"image": name, "lines": rec["lines"]}          # no "text": the lines in order make it
        with open(folder / "labels.jsonl", "a") as f:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    tok = Tokenizer.from_file(str(ROOT / "demo_model/tokenizer.json"))
    ids = special_ids(tok)
    spec = PoolSpec(generated=2, data_seed=7000, reading_frac=0.5, degrade_prob=0.5, dirs=(str(folder),),
                    shifts=3, max_shift=20, max_target_tokens=900, glyph_chars=1024, seed=0)
    pool = build_pool(spec, tok, ids["eos_token_id"], tmp / "cache", "cpu", workers=1)
    return pool, tok, ids, recs, spec, tmp


def test_pool_holds_generated_and_folder_pages(pool_setup):
    from edgeocr.preprocess import letterbox, load_image
    from quantize.tokenizer_build import special_ids  # noqa: F401 - same tokenizer as the pool
    from quantize.train.pool import FULL_TEXT, PoolSpec, build_pool

    pool, tok, ids, recs, spec, tmp = pool_setup
    assert len(pool) == 4 and pool.canvases.shape == (4, 1024, 1024, 3) and pool.canvases.dtype == torch.uint8
    canvas, _ = letterbox(load_image(tmp / "html_pages" / "000001.jpg"))
    assert torch.equal(pool.canvases[3], torch.from_numpy(canvas))           # the runtime's letterbox
    full = pool.targets[3, FULL_TEXT, :pool.lengths[3, FULL_TEXT]].tolist()
    assert full == tok.encode("\n".join(ln["text"] for ln in recs[1]["lines"])).ids + [ids["eos_token_id"]]
    assert (pool.shifts[:, 0] == 0).all() and (pool.shifts[:, 1:].abs() <= 20).all()
    assert (pool.shifts[:, 1:] != 0).any()
    again = build_pool(spec, tok, ids["eos_token_id"], tmp / "cache", "cpu", workers=1)   # from the cache
    assert torch.equal(again.canvases, pool.canvases) and torch.equal(again.targets, pool.targets)
    other = build_pool(PoolSpec(**{**spec.__dict__, "generated": 1, "dirs": ()}), tok, ids["eos_token_id"],
                       tmp / "cache2", "cpu", workers=1)
    assert torch.equal(other.canvases[0], pool.canvases[0])                  # seeded generator pages
    # rendered on 2 processes (each writes its pages into the shared canvas file): the same pool
    forked = build_pool(spec, tok, ids["eos_token_id"], tmp / "cache3", "cpu", workers=2)
    for name in ("canvases", "targets", "shifts", "chars"):
        assert torch.equal(getattr(forked, name), getattr(pool, name)), name


def test_shifted_view_matches_its_spotting_target(pool_setup):
    """A shifted placement moves the pixels and the boxes of its pre-tokenized spotting target alike."""
    from quantize.train import augment
    from quantize.train.pages import Page, spotting_target

    pool, tok, ids, recs, spec, tmp = pool_setup
    k, v = 2, 2                                                               # a folder page, a shifted placement
    dx, dy = pool.shifts[k, v].tolist()
    moved = augment.shift(pool.canvases[k:k + 1], pool.shifts[k, v][None])[0]
    src = pool.canvases[k]
    ys, xs = slice(max(0, dy), 1024 + min(0, dy)), slice(max(0, dx), 1024 + min(0, dx))
    assert torch.equal(moved[ys, xs], src[max(0, -dy):1024 - max(0, dy), max(0, -dx):1024 - max(0, dx)])
    assert (moved[:max(0, dy)] == 255).all() and (moved[:, 1024 + min(0, dx):] == 255).all()
    scale = 1024 / max(recs[0]["width"], recs[0]["height"])
    page = Page(np.zeros(1), "", tuple((ln["text"], tuple(c * scale for c in ln["box"])) for ln in recs[0]["lines"]))
    want = tok.encode(spotting_target(page, (dx, dy))).ids[:900]
    got = pool.targets[k, 1 + v, :pool.lengths[k, 1 + v]].tolist()
    assert got[:len(want)] == want and want != tok.encode(spotting_target(page)).ids[:900]


def test_batches_are_seeded_prompt_plus_target(pool_setup):
    from quantize.train.batch import Prompts, Sampler
    from quantize.train.forward import IGNORE
    from quantize.train.pages import TASKS

    pool, tok, ids, recs, spec, tmp = pool_setup
    pr = Prompts(tok, ids, 32 * 33 + 2, "cpu")
    s = Sampler(pool, pr, 6, seed=3)
    up = (lambda arrays: [torch.from_numpy(a) for a in arrays])
    a, b = s(5, up), s(5, up)
    assert torch.equal(a.input_ids, b.input_ids) and not torch.equal(a.input_ids, s(6, up).input_ids)
    page, task, place = s.draw(5)
    assert a.input_ids.shape[1] % 64 == 0
    for r in range(6):
        row = 0 if task[r] == 0 else 1 + place[r]
        target = pool.targets[page[r], row, :pool.lengths[page[r], row]].tolist()
        prompt = pr.ids[task[r], :pr.lengths[task[r]]].tolist()
        n = len(prompt) + len(target)
        assert a.input_ids[r, :n].tolist() == prompt + target
        assert (a.input_ids[r, n:] == ids["pad_token_id"]).all()
        assert a.labels[r, len(prompt):n].tolist() == target
        assert (a.labels[r, :len(prompt)] == IGNORE).all() and (a.labels[r, n:] == IGNORE).all()
        assert torch.equal(a.shifts[r], pool.shifts[page[r], place[r]])
        assert prompt.count(ids["image_token_id"]) == 32 * 33 + 2 and TASKS[task[r]]


def test_glyph_targets_place_characters_in_their_token():
    """Each character lands in the 32x32 cell its (shifted) centre falls in, numbered in reading order
    inside its cell; characters past SLOTS in a cell, off the grid or padding are left out."""
    from quantize.train.glyph import SLOTS, glyph_targets

    none = 99
    chars = torch.tensor([[[16, 50, 1], [48, 50, 2], [128, 50, 3], [72, 5, 4]] + [[0, 0, -1]] * 4,
                          [[5, 5, 7]] * 8], dtype=torch.int16)                      # [2, 8, 3]
    t = glyph_targets(chars, torch.tensor([[0, 0], [40, 0]]), grid=8, n_cls=none + 1)
    assert t.shape == (2, 64, SLOTS)
    g = 8
    assert t[0, g + 0, 0] == 1 and t[0, g + 1, 0] == 2 and t[0, g + 4, 0] == 3 and t[0, 2, 0] == 4
    assert (t[0, g + 0, 1:] == none).all() and int((t[0] != none).sum()) == 4
    # page 2: eight characters in one cell, shifted by 40 px -> cell 1; only SLOTS of them, in order
    assert t[1, 1].tolist() == [7] * SLOTS and int((t[1] != none).sum()) == SLOTS
    off = glyph_targets(chars[:1], torch.tensor([[-40, 0]]), grid=8, n_cls=none + 1)
    # x 16 -> -24 falls off the grid; 48 -> 8, 128 -> 88, 72 -> 32 move to columns 0, 2, 1
    assert int((off != none).sum()) == 3 and off[0, g + 0, 0] == 2 and off[0, g + 2, 0] == 3 and off[0, 1, 0] == 4


def test_augmentation_is_seeded_and_keeps_the_page():
    from quantize.train import augment

    canv = torch.full((3, 64, 64, 3), 255, dtype=torch.uint8)
    canv[:, 20:40, 10:50] = 0                                                      # a dark block on white
    zero = torch.zeros(3, 2, dtype=torch.int32)
    px = [augment.to_pixels(canv, zero, 1.0, torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert px[0].shape == (3, 3, 64, 64) and torch.equal(px[0], px[1]) and not torch.equal(px[0], px[2])
    plain = augment.to_pixels(canv, zero, 0.0, None)
    lut = torch.from_numpy(np.asarray(__import__("edgeocr.preprocess", fromlist=["_LUT"])._LUT))
    assert torch.equal(plain[0, :, 0, 0], lut[:, 255]) and torch.equal(plain[0, :, 30, 30], lut[:, 0])
    # augmented: still a dark block on a light page, not the same pixels
    assert (px[0][:, :, 30, 30] < px[0][:, :, 5, 5] - 1.0).all() and not torch.equal(px[0], plain)


def test_the_pool_is_fixed_by_the_data_flags_not_by_the_training_seed():
    """A run continuing another with a new --seed (other page draws and augmentation) loads the cached pool of
    the same data flags; a new --data-seed or another folder gives another pool."""
    from quantize.train.config import TrainConfig
    from quantize.train.loop import RunOptions, pool_spec

    opts = RunOptions(page_dirs=("/data/a",))
    base = pool_spec(TrainConfig(seed=0, data_seed=8500), opts)
    assert pool_spec(TrainConfig(seed=1, data_seed=8500), opts) == base
    assert pool_spec(TrainConfig(seed=0, data_seed=8501), opts) != base
    assert pool_spec(TrainConfig(seed=0, data_seed=8500), RunOptions(page_dirs=("/data/b",))) != base


def test_print_pool_key_is_the_fingerprint_a_cached_pool_is_checked_against(capsys):
    """`python -m quantize.train --print-pool-key` (scripts/gpu_curriculum.sh names its pool folders with it):
    the fingerprint build_pool checks, the same for another --seed or --lr, another for other data flags; it
    needs the tokenizer."""
    from tokenizers import Tokenizer

    from quantize.train.__main__ import main
    from quantize.train.config import TrainConfig
    from quantize.train.loop import RunOptions, pool_spec

    def key(*flags):
        assert main(["unused", "--init", str(ROOT / "demo_model"), "--print-pool-key", *flags]) == 0
        return capsys.readouterr().out.strip()

    base = key("--data-seed", "9", "--pool-pages", "2", "--pages", "/data/a")
    tok = Tokenizer.from_file(str(ROOT / "demo_model/tokenizer.json")).to_str()
    want = pool_spec(TrainConfig(data_seed=9, pool_pages=2), RunOptions(page_dirs=("/data/a",))).fingerprint(tok)
    assert base == want
    assert key("--data-seed", "9", "--pool-pages", "2", "--pages", "/data/a", "--seed", "3", "--lr", "1e-4") == base
    assert key("--data-seed", "10", "--pool-pages", "2", "--pages", "/data/a") != base
    with pytest.raises(SystemExit, match="needs --init"):
        main(["unused", "--print-pool-key"])
