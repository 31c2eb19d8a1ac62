"""The training script at toy size on CPU: runs, logs, resumes, and its checkpoint exports and runs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from edgeocr.decode import DecodeOptions
from edgeocr.model import OCRModel


DEMO_TOKENIZER = str(Path(__file__).resolve().parents[1] / "demo_model" / "tokenizer.json")


def _train(out, steps, *extra, tokenizer=DEMO_TOKENIZER):
    steps_arg = ["--steps", str(steps)] if steps else []
    tok = ["--tokenizer", tokenizer] if tokenizer else []
    r = subprocess.run([sys.executable, "-m", "quantize.train", str(out), "--tiny", *steps_arg, "--batch", "2",
                        "--pool-pages", "4", "--workers", "2", "--eval-every", "0", "--device", "cpu", *tok, *extra],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_train_resume_export_run(tmp_path):
    out = tmp_path / "run"
    _train(out, 2, tokenizer=None)                          # a fresh tokenizer, built from generator text
    r = _train(out, 3, "--resume", "--budget-s", "0")       # a time-limited invocation stops with state saved
    assert "budget of 0 s reached at step 2" in r.stderr
    r = _train(out, 3, "--resume")
    assert "resumed at step 2" in r.stderr
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log] == [1, 2, 3] and all(x["loss"] > 0 for x in log)
    ck = out / "checkpoint"
    art = tmp_path / "art"
    subprocess.run([sys.executable, "-m", "quantize", "export", str(ck), str(art), "--cache-len", "1280",
                    "--prefill-len", "1200"], check=True, capture_output=True, timeout=600)
    res = OCRModel(art).recognize(_page(tmp_path),
                                  options=DecodeOptions(max_new_tokens=3))
    assert res.generated_tokens >= 1
    from quantize.train import eval_pages          # the per-page evaluation behind eval_cer and scripts/eval_ckpt.py
    rows = eval_pages(ck, 1, tokens=3, device="cpu")
    assert len(rows) == 1 and rows[0]["image"] == "000000.jpg" and 1 <= rows[0]["tokens"] <= 3
    assert rows[0]["cer"] > 0.5                     # three tokens cannot cover a page
    batched = eval_pages(ck, 2, tokens=3, device="cpu", batch=2)        # one generate call for both pages
    assert [r["text"] for r in batched] == [r["text"] for r in eval_pages(ck, 2, tokens=3, device="cpu")]
    eval_dir = Path(__file__).resolve().parents[1] / "calibration_data" / "eval"    # any labelled folder (--dir)
    assert eval_pages(ck, 2, tokens=3, device="cpu", batch=2, subset="nope", folder=eval_dir) == batched
    more = tmp_path / "more"                        # --init: continue a checkpoint (its sizes, its tokenizer)
    _train(more, 1, "--init", str(ck), tokenizer=None)
    assert (more / "checkpoint" / "tokenizer.json").read_bytes() == (ck / "tokenizer.json").read_bytes()
    assert json.loads((more / "run_summary.json").read_text())["recipe"]["init"] == str(ck)


def test_resume_keeps_the_stored_step_count(tmp_path):
    """A step-scheduled run stopped by its budget and resumed without --steps finishes its own schedule
    (not the default step count)."""
    out = tmp_path / "steps"
    r = _train(out, 3, "--budget-s", "0")
    assert "budget of 0 s reached at step 0" in r.stderr
    r = _train(out, None, "--resume")
    assert "resumed at step 0 of 3" in r.stderr
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log] == [1, 2, 3]


def test_time_schedule_ends_on_time_across_resume(tmp_path):
    """--gpu-seconds: the schedule runs on seconds trained; a budget-stopped invocation resumes on the same
    time schedule and the run ends once the seconds are trained, learning rate decayed."""
    out = tmp_path / "timed"
    r = _train(out, None, "--gpu-seconds", "4", "--budget-s", "1.5")
    assert "state saved" in r.stderr
    r = _train(out, None, "--resume")
    assert "resumed at step" in r.stderr and " of 4 s" in r.stderr and "done:" in r.stderr
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert 4.0 <= log[-1]["elapsed_s"] < 4.0 + 3 * max(x["step_s"] for x in log)
    assert [x["step"] for x in log] == list(range(1, len(log) + 1))
    # the run's summary: both invocations, page views = batch x steps, throughput; no GPU here
    summary = json.loads((out / "run_summary.json").read_text())
    assert len(summary["invocations"]) == 2 and summary["recipe"]["gpu_seconds"] == 4
    total = summary["total"]
    assert total["finished"] and total["steps"] == len(log) and total["page_views"] == 2 * len(log)
    assert abs(total["train_s"] - log[-1]["elapsed_s"]) < 0.2 and total["gpu_busy_pct"] is None
    assert abs(total["page_views_per_s"] - total["page_views"] / total["train_s"]) < 0.01
    assert all(x["page_views_s"] > 0 for x in log)
    # each step's learning rate follows the seconds trained before it: warm-up x cosine over 4 s
    for x in log:
        before = max(0.0, x["elapsed_s"] - x["step_s"])
        want = 1.5e-3 * min(1.0, x["step"] / 150) * 0.5 * (1 + math.cos(math.pi * min(1.0, before / 4)))
        assert abs(x["lr"] - want) <= 0.03 * 1.5e-3 * min(1.0, x["step"] / 150), (x, want)


def _page(tmp_path):
    from quantize.docgen import GenOptions, make_document
    img, _ = make_document(0, 5, GenOptions(degrade=False))
    p = tmp_path / "page.png"
    img.save(p)
    return p


def test_glyph_loss_trains_and_stays_out_of_the_checkpoint(tmp_path):
    out = tmp_path / "glyph"
    _train(out, 2, "--glyph-loss", "1.0")
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert all(x["loss_glyph"] > 0 and abs(x["loss"] - x["loss_text"] - x["loss_glyph"]) < 1e-3 for x in log)
    from safetensors import safe_open
    with safe_open(str(out / "checkpoint" / "model.safetensors"), "np") as f:
        assert not [k for k in f.keys() if "glyph" in k]
    r = _train(out, 3, "--resume", "--glyph-loss", "1.0")
    assert "resumed at step 2" in r.stderr
    # the head is kept beside the weights, so a stage that continues this checkpoint continues its head
    import torch
    saved = torch.load(out / "checkpoint" / "glyph_head.pt", weights_only=True)
    r = _train(tmp_path / "next", 1, "--init", str(out / "checkpoint"), "--glyph-loss", "1.0")
    assert "glyph head: continued from" in r.stderr
    again = torch.load(tmp_path / "next" / "checkpoint" / "glyph_head.pt", weights_only=True)
    assert set(again) == set(saved) and all(again[k].shape == saved[k].shape for k in saved)
    (out / "checkpoint" / "glyph_head.pt").unlink()     # a checkpoint without one: a fresh head, kept off the encoder
    r = _train(tmp_path / "fresh", 1, "--init", str(out / "checkpoint"), "--glyph-loss", "1.0")
    assert "glyph head: fresh; the encoder gets no glyph gradient" in r.stderr


def test_glyph_head_of_another_shape_is_not_loaded(tmp_path):
    from quantize.train.glyph import GlyphHead, load_glyph_head, save_glyph_head
    save_glyph_head(GlyphHead(32, 10, 4), tmp_path)
    assert load_glyph_head(GlyphHead(32, 10, 4), tmp_path)
    assert not load_glyph_head(GlyphHead(48, 10, 4), tmp_path)
    assert not load_glyph_head(GlyphHead(32, 10, 4), tmp_path / "none")


@pytest.mark.parametrize("subset", ["nope", "../eval", "/tmp"])
def test_eval_pages_refuses_an_unknown_set_before_loading(tmp_path, subset):
    """Only the held-out folders are evaluation sets; the name is checked before any model is loaded (the
    checkpoint here does not exist)."""
    from quantize.train.evaluate import eval_pages
    with pytest.raises(ValueError, match="evaluation set must be one of"):
        eval_pages(tmp_path / "no-checkpoint", 1, subset=subset)


def test_eval_pages_refuses_a_folder_without_labels(tmp_path):
    """A folder to measure must carry its labels (labels.jsonl or labels.csv); said before any model is loaded."""
    from quantize.train.evaluate import eval_pages
    (tmp_path / "pages").mkdir()
    with pytest.raises(ValueError, match="no labels.jsonl or labels.csv"):
        eval_pages(tmp_path / "no-checkpoint", 1, folder=tmp_path / "pages")


def test_max_target_tokens_reaches_the_run_and_a_too_small_one_is_refused(tmp_path, monkeypatch):
    """`--max-target-tokens` (the real HTML pages reach about 1,500 tokens) is the run's cut, also with --tiny
    (whose own cut is 64); below 16 the command line names the value."""
    import quantize.train.loop as loop
    from quantize.train.__main__ import main
    from quantize.train.config import TrainConfig

    seen = []
    monkeypatch.setattr(loop, "train", lambda out, cfg, opts: seen.append(cfg))
    main([str(tmp_path / "a"), "--device", "cpu", "--max-target-tokens", "1024"])
    main([str(tmp_path / "b"), "--device", "cpu", "--tiny", "--max-target-tokens", "100"])
    main([str(tmp_path / "c"), "--device", "cpu"])
    assert [c.max_target_tokens for c in seen] == [1024, 100, TrainConfig.max_target_tokens]
    with pytest.raises(SystemExit, match="--max-target-tokens 8: expected at least 16"):
        main([str(tmp_path / "d"), "--device", "cpu", "--max-target-tokens", "8"])


def test_curriculum_calls_share_a_pool_across_training_seeds(tmp_path):
    """scripts/gpu_curriculum.sh on the CPU: a later call whose stage has the same data flags and another --seed
    loads the pool the first call rendered (a later call on the GPU machine skips the rendering); a call with other
    data flags deletes the pools it does not use and renders its own."""
    import os
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",   # its python3: this one
           "DEVICE": "cpu", "POOLS": str(tmp_path / "pools"), "POOL_PAGES": "2", "BATCH": "2",
           "DIAG_PAGES": "0", "EVAL_PAGES": "0", "EVAL_HTML_PAGES": "0", "DEADLINE_S": "900", "RESERVE_S": "0"}

    def call(run, stages, init="demo_model"):
        r = subprocess.run(["bash", "scripts/gpu_curriculum.sh"], cwd=root, capture_output=True, text=True,
                           timeout=900, env={**env, "RUN": str(tmp_path / run), "INIT": str(init), "STAGES": stages})
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert (tmp_path / run / "out" / "final.tar.gz").exists()
        return r.stdout, (tmp_path / run / f"{stages.split('|')[0]}.log").read_text()

    data = "--data-seed 9 --reading-frac 0.5 --max-target-tokens 64"
    log, train_log = call("c1", f"a|2|{data}")
    assert "page pool: 2 pages (2 generated, 0 from folders) rendered" in log + train_log
    assert len(os.listdir(tmp_path / "pools")) == 1
    (pool,) = os.listdir(tmp_path / "pools")
    assert len(pool) == 16 and set(pool) <= set("0123456789abcdef")       # the pool's fingerprint
    (tmp_path / "pools" / "other").mkdir()                                  # not a pool: left alone
    log, train_log = call("c2", f"b|2|--seed 1 --lr 5e-4 {data}", init=tmp_path / "c1" / "a" / "checkpoint")
    assert "is there (rendered by an earlier call" in log and "page pool: 2 pages loaded from" in train_log
    cfg = json.loads((tmp_path / "c2" / "b" / "train_config.json").read_text())
    assert cfg["seed"] == 1 and cfg["lr"] == 5e-4
    log, _ = call("c3", "c|2|--data-seed 10 --reading-frac 0.5 --max-target-tokens 64")
    assert f"deleting the page pool {tmp_path / 'pools' / pool}" in log
    left = os.listdir(tmp_path / "pools")
    assert "other" in left and pool not in left and len(left) == 2
