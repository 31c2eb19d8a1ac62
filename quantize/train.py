"""Train a small HunyuanVL-architecture OCR model on synthetic business documents (issue 8).

    python -m quantize.train OUT [--steps N | --gpu-seconds S] [--batch 24] [--device cuda] [--resume]
                                 [--budget-s S]

transformers' own HunYuanVLForConditionalGeneration (so the checkpoint has the real format), its own
byte-level BPE tokenizer.json with the real special-token names, documents from the calibration_data
generator rendered at the runtime's 1024x1024 letterboxed input, the official prompts for full text
(structured_parse) and spotting (0-1000 boxes of the canvas).  Seeded and resumable (OUT/train_state.pt);
progress and a loss/CER log in OUT/train_log.jsonl; the final checkpoint in OUT/checkpoint.

`--gpu-seconds S` runs the schedule on time instead of steps: learning-rate decay, the curriculum and the
end follow the seconds trained (kept in the resumable state), so a run ends after S seconds of training
with its learning rate fully decayed whatever the machine's speed; the step count reached is logged.
Data order is seeded either way; `--steps N` gives a step-exact rerun.  `--budget-s S` stops this invocation after S seconds with the
state saved, for machines whose commands are time-limited; `--resume` continues it.
Pages are rendered by a process pool ahead of the GPU (a few batches in flight); the uint8 canvases are
normalized and patchified on the device with the runtime's lookup table, so training sees exactly the
pixels the runtime feeds the encoder.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from edgeocr import prompts
from edgeocr.preprocess import CANVAS, letterbox

TASKS = ("structured_parse", "spotting")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 3000                 # optimizer steps
    batch: int = 16                   # documents per step
    lr: float = 1.5e-3                # peak learning rate (AdamW), cosine decay
    warmup: int = 150                 # linear warm-up steps
    weight_decay: float = 0.05
    reading_frac: float = 0.0         # share of random-line reading pages (reading_page) among the pages
    curriculum: float = 0.0           # share of the run over which reading pages grow from large type and
                                      # few lines to full pages, and their share falls from 0.9 to reading_frac
    seed: int = 0
    data_seed: int = 7000             # generator seed (calib uses 1001, eval 2002)
    tok_seed: int = 7099              # generator seed of the tokenizer's corpus
    workers: int = 8                  # document-rendering processes
    reuse: int = 1                    # each step renders batch/reuse new pages and draws the rest from the
                                      # last replay_pages pages (seeded): rendering is the bottleneck on GPUs
    replay_pages: int = 2048
    glyph_loss: float = 0.0           # weight of the encoder's per-cell character loss (0 = off); see glyph_cells
    max_target_tokens: int = 640      # longer targets are cut (rare for these documents)
    eval_every: int = 250             # steps between CER evaluations on calibration_data/eval
    eval_images: int = 4
    eval_tokens: int = 700
    save_every: int = 250             # steps between resumable checkpoints
    bpe_vocab: int = 2200             # BPE entries before the special tokens
    # model sizes: keep the checkpoint <= 12 MB in bf16 (at most 6.0M parameters)
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 512
    v_hidden: int = 192
    v_layers: int = 4
    v_heads: int = 4
    v_intermediate: int = 448
    max_image_size: int = 1024        # position grid 64x64: the runtime's grid, no resize needed


def canvas_target(rec: dict, scale: float, task: str) -> str:
    """Target string for `task`; spotting boxes (in the page's pixels, `scale` = canvas px per page px)
    in 0..1000 of the letterboxed canvas."""
    if task == "structured_parse":
        return rec["text"]
    k = scale * 1000 / CANVAS
    out = []
    for ln in rec["lines"]:
        x1, y1, x2, y2 = ln["box"]
        b = [min(1000, int(v * k)) for v in (x1, y1, x2, y2)]
        out.append(f"{ln['text']}({b[0]},{b[1]}),({b[2]},{b[3]})")
    return "".join(out)


def reading_page(index: int, seed: int, level: float = 1.0) -> tuple[np.ndarray, dict]:
    """A canvas of random lines (digits, Latin, the generator's CJK characters) in random fonts and sizes.

    No language prior can predict these lines, so they teach the encoder to read; the business documents
    then teach layout and reading order.  `level` in [0, 1] is the curriculum: at 0 a few short lines in
    large type (36-96 px), at 1 up to 600 characters at 12-44 px.  Returns (canvas uint8 [S, S, 3],
    record with text and line boxes).
    """
    from PIL import Image, ImageDraw

    from quantize.docgen.fonts import discover, generator_charset, truetype

    rng = np.random.default_rng([seed, index, 17])
    cjk_chars = [c for c in generator_charset() if ord(c) > 0x2E80]
    latin = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    punct = ".,:;-/#()%&*+@"
    fs = discover()
    bg = int(rng.integers(225, 256))
    img = Image.new("RGB", (CANVAS, CANVAS), (bg, bg, max(0, bg - int(rng.integers(0, 12)))))
    draw = ImageDraw.Draw(img)
    lv = min(1.0, max(0.0, level))
    lo, hi = 36 + (12 - 36) * lv, 96 + (44 - 96) * lv                    # type size range, px
    size = int(np.exp(rng.uniform(np.log(lo), np.log(hi))))
    budget = int(rng.integers(int(20 + 100 * lv), int(120 + 480 * lv)))   # characters on the page
    y, lines = int(rng.integers(8, 40)), []
    while sum(len(ln["text"]) for ln in lines) < budget:
        size_l = max(10, int(size * rng.uniform(0.85, 1.2)))
        if y + size_l * 1.4 > CANVAS - 8:
            break
        mix = rng.random()
        face = fs.pick(rng, cjk=mix < 0.5, bold=rng.random() < 0.2)
        font = truetype(face, size_l)
        x0 = int(rng.integers(8, 120))
        words = []
        limit = rng.uniform(0.3, 1.0) * (CANVAS - x0 - 8)
        while True:
            kind = rng.random()
            if mix < 0.5 and kind < 0.55:
                w = "".join(rng.choice(cjk_chars, int(rng.integers(1, 7))))
            elif kind < 0.8:
                w = "".join(rng.choice(list("0123456789"), int(rng.integers(1, 12))))
                if rng.random() < 0.3:
                    w = w[:-2] + "." + w[-2:] if len(w) > 2 else w
            else:
                w = "".join(rng.choice(list(latin), int(rng.integers(1, 9))))
            if rng.random() < 0.15:
                w += str(rng.choice(list(punct)))
            cand = (" ".join(words + [w])) if words else w
            tw = draw.textlength(cand, font=font)
            if tw > limit:
                break
            words.append(w)
        if words:
            text = " ".join(words)
            ink = int(rng.integers(0, 90))
            draw.text((x0, y), text, font=font, fill=(ink, ink, ink + int(rng.integers(0, 40))))
            l, t, r, b = draw.textbbox((x0, y), text, font=font)
            lines.append({"text": text, "box": [l, t, r, b]})
        y += int(size_l * rng.uniform(1.3, 2.2))
    canvas = np.asarray(img, dtype=np.uint8).copy()
    return canvas, {"text": "\n".join(ln["text"] for ln in lines), "lines": lines}


CELL = 32                      # canvas pixels per merged image token (patch 16 x merge 2)
GRID = CANVAS // CELL          # merged tokens per side
SLOTS = 6                      # characters per token the glyph loss names, in reading order


@lru_cache(maxsize=1)
def _charset_index() -> dict:
    """Character -> class of the glyph loss (the generator's charset, sorted); built once per process."""
    from quantize.docgen.fonts import generator_charset
    return {c: i for i, c in enumerate(sorted(generator_charset()))}


def glyph_cells(lines: list[dict], scale: float) -> np.ndarray:
    """Which characters lie in which merged image token, in reading order: [K, 3] int32 (cell = row * GRID
    + col, slot = the character's place among its cell's characters (lines in order, then left to right),
    class = index in the generator's charset, len(charset) for any other character).

    Characters are placed along each line's box by width class (CJK 2, others 1), which is close enough
    at 32-pixel cells; characters past SLOTS in one cell are left out.  The targets of the encoder's
    auxiliary loss (`--glyph-loss`): it teaches the encoder glyphs, and their order inside a token,
    directly instead of only through the decoder.
    """
    index = _charset_index()
    other = len(index)
    out, used = [], {}
    for ln in lines:
        x1, y1, x2, y2 = (v * scale for v in ln["box"])
        text = ln["text"]
        widths = [2 if ord(c) > 0x2E80 else 1 for c in text]
        total, acc = sum(widths), 0
        row = int((y1 + y2) / 2 // CELL)
        for c, w in zip(text, widths):
            xc = x1 + (x2 - x1) * (acc + w / 2) / total
            acc += w
            col = int(xc // CELL)
            if not c.isspace() and 0 <= row < GRID and 0 <= col < GRID:
                cell = row * GRID + col
                slot = used.get(cell, 0)
                if slot < SLOTS:
                    out.append((cell, slot, index.get(c, other)))
                    used[cell] = slot + 1
    return np.asarray(out, np.int32).reshape(-1, 3)


class GlyphLoss:
    """The encoder's auxiliary loss (`--glyph-loss W`): a linear head on each merged image token's
    embedding names the characters in its 32x32 cell, slot by slot in reading order (SLOTS softmax
    classifiers over the charset + 'other' + 'none'; targets from `glyph_cells`).  Cross-entropy summed
    over the slots, averaged over the tokens.  Training only: the head is not part of the checkpoint (it
    is kept in the resumable state)."""

    def __init__(self, model, hidden: int, device):
        import torch

        tower = getattr(getattr(model, "model", None), "vision_tower", None)
        if tower is None:
            raise ValueError("--glyph-loss: this transformers' HunYuanVL model has no model.vision_tower to read")
        self.n_cls = len(_charset_index()) + 2          # charset, other, none
        self.head = torch.nn.Linear(hidden, SLOTS * self.n_cls).to(device)
        r = torch.arange(GRID)
        # the encoder's rows: begin, GRID x (GRID cells + newline), end
        self.cells = (1 + r[:, None] * (GRID + 1) + r[None, :]).reshape(-1).to(device)
        self.feats = None
        tower.register_forward_hook(self._keep)

    def _keep(self, module, args, out):
        import torch
        self.feats = out if torch.is_tensor(out) else out.pooler_output

    def __call__(self, batch: list):
        import torch
        import torch.nn.functional as F

        b = len(batch)
        v = self.feats.reshape(b, -1, self.feats.shape[-1])[:, self.cells]               # [B, GRID^2, H]
        logits = self.head(v).float().reshape(b, GRID * GRID, SLOTS, self.n_cls)
        target = torch.full((b, GRID * GRID, SLOTS), self.n_cls - 1, dtype=torch.long)   # 'none'
        for k, item in enumerate(batch):
            g = torch.from_numpy(item[3]).long()
            target[k, g[:, 0], g[:, 1]] = g[:, 2]
        target = target.to(logits.device, non_blocking=True)
        return F.cross_entropy(logits.reshape(-1, self.n_cls), target.reshape(-1), reduction="sum") / (b * GRID * GRID)


def render(args) -> tuple[np.ndarray, str, str, np.ndarray]:
    """Worker: (index, generator seed, share of reading pages, curriculum level) -> (canvas uint8
    [S, S, 3], task, target, glyph cells)."""
    index, seed, reading_frac, level = args
    task = TASKS[index % len(TASKS)]
    if reading_frac and np.random.default_rng([seed, index, 3]).random() < reading_frac:
        canvas, rec = reading_page(index, seed, level)          # drawn on the canvas itself
        return canvas, task, canvas_target(rec, 1.0, task), glyph_cells(rec["lines"], 1.0)
    from quantize.docgen import GenOptions, make_document
    img, rec = make_document(index, seed, GenOptions(degrade_prob=0.5))
    canvas, lb = letterbox(img)
    return canvas, task, canvas_target(rec, lb.scale, task), glyph_cells(rec["lines"], lb.scale)


class PageFeed:
    """Training batches from a process pool rendering ahead of the GPU (a few batches in flight).

    With `cfg.reuse` R > 1 each batch holds batch/R newly rendered pages and batch - batch/R pages drawn
    (seeded) from the last `cfg.replay_pages` rendered ones, so the GPU is not held up by rendering; the
    draw depends only on the seed and the step the run (or its resume) started at.  `wait_s` is the time
    spent waiting for rendered pages.
    """

    def __init__(self, cfg: TrainConfig, pool, schedule, start_step: int = 0, render_fn=None):
        self.cfg, self.pool, self.schedule = cfg, pool, schedule
        self.render = render_fn or render
        self.fresh = max(1, cfg.batch // max(1, cfg.reuse))
        self.next_doc = start_step * self.fresh          # the first page a resumed run has not used
        self.pending: deque = deque()
        self.replay: deque = deque(maxlen=cfg.replay_pages)
        self.rng = np.random.default_rng([cfg.seed, start_step, 11])
        self.wait_s = 0.0

    def _submit(self) -> None:
        frac, level = self.schedule()
        jobs = [(self.next_doc + k, self.cfg.data_seed, frac, level) for k in range(self.fresh)]
        self.pending.append(self.pool.map_async(self.render, jobs) if self.pool else [self.render(j) for j in jobs])
        self.next_doc += self.fresh

    def take(self) -> list:
        while len(self.pending) < (4 if self.pool else 1):
            self._submit()
        t = time.perf_counter()
        r = self.pending.popleft()
        new = r if isinstance(r, list) else r.get()
        self.wait_s += time.perf_counter() - t
        batch = list(new)
        if self.fresh < self.cfg.batch:
            if self.replay:
                batch += [self.replay[int(i)] for i in self.rng.integers(0, len(self.replay), self.cfg.batch - self.fresh)]
            self.replay.extend(new)
        return batch


def build_corpus(n: int, seed: int) -> list[str]:
    from quantize.docgen import GenOptions, make_document
    texts = list(prompts.TASKS_ZH.values()) + list(prompts.TASKS_EN.values())
    for i in range(n):
        _, rec = make_document(i, seed, GenOptions(degrade=False))
        texts.append(rec["text"])
    return texts


def make_model(cfg: TrainConfig, out: Path, init: Path | None = None, tokenizer: Path | None = None):
    """A fresh model and tokenizer written to out/checkpoint, or (init) the weights and tokenizer of a
    checkpoint this script trained, to train further."""
    import shutil

    import torch
    from transformers import GenerationConfig, HunYuanVLConfig, HunYuanVLForConditionalGeneration

    from quantize.tokenizer_build import build_tokenizer, special_ids, tokenizer_config

    if init is not None:
        from tokenizers import Tokenizer
        ck = out / "checkpoint"
        ck.mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if (Path(init) / name).resolve() != (ck / name).resolve():
                shutil.copyfile(Path(init) / name, ck / name)
        model = HunYuanVLForConditionalGeneration.from_pretrained(str(init), dtype=torch.float32)
        return model, special_ids(Tokenizer.from_file(str(ck / "tokenizer.json")))
    if tokenizer is not None:                   # reuse a tokenizer.json (this script's, same seed: identical)
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(tokenizer))
    else:
        tok = build_tokenizer(build_corpus(600, cfg.tok_seed), cfg.bpe_vocab)
    ids = special_ids(tok)
    q = cfg.head_dim // 8
    text = dict(vocab_size=tok.get_vocab_size(with_added_tokens=True), hidden_size=cfg.hidden,
                intermediate_size=cfg.intermediate, num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim, max_position_embeddings=8192,
                rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=ids["bos_token_id"],
                eos_token_id=ids["eos_token_id"], pad_token_id=ids["pad_token_id"], eod_token_id=ids["eod_token_id"],
                rope_theta=10000.0, rope_scaling={"type": "xdrope", "alpha": 1000.0, "factor": 1.0,
                                                  "xdrope_section": [q, q, q, q]})
    vision = dict(hidden_size=cfg.v_hidden, intermediate_size=cfg.v_intermediate, num_hidden_layers=cfg.v_layers,
                  num_attention_heads=cfg.v_heads, patch_size=16, spatial_merge_size=2,
                  max_image_size=cfg.max_image_size, out_hidden_size=cfg.hidden, rms_norm_eps=1e-5)
    hcfg = HunYuanVLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True,
                           image_token_id=ids["image_token_id"], im_start_id=ids["im_start_id"],
                           im_end_id=ids["im_end_id"], im_newline_id=ids["im_newline_id"])
    torch.manual_seed(cfg.seed)
    model = HunYuanVLForConditionalGeneration(hcfg)
    ck = out / "checkpoint"
    ck.mkdir(parents=True, exist_ok=True)
    tok.save(str(ck / "tokenizer.json"))
    (ck / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tok), ensure_ascii=False, indent=2))
    GenerationConfig(bos_token_id=ids["bos_token_id"], pad_token_id=ids["pad_token_id"],
                     eos_token_id=[ids["eos_token_id"], ids["eod_token_id"]], do_sample=False,
                     repetition_penalty=1.08).save_pretrained(ck)
    return model, ids


def collate(batch, ids: dict, tok, cfg: TrainConfig, device):
    """Canvases + targets -> model inputs with loss only on the answer tokens."""
    import torch

    ptoks = prompts.PromptTokens(bos=ids["bos_token_id"], system_sep=ids["system_sep_token_id"],
                                 im_start=ids["im_start_id"], im_end=ids["im_end_id"],
                                 image=ids["image_token_id"], user=ids["user_token_id"])
    n_img = 32 * 33 + 2
    seqs, labels = [], []
    for _, task, target, *_ in batch:
        p = prompts.build_prompt_ids(ptoks, n_img, tok.encode(prompts.task_prompt(task)).ids)
        t = tok.encode(target).ids
        # a cut target gets no end token: the model must not learn to stop mid-page
        t = t[: cfg.max_target_tokens] if len(t) > cfg.max_target_tokens else t + [ids["eos_token_id"]]
        seqs.append(p + t)
        labels.append([-100] * len(p) + t)
    L = max(map(len, seqs))
    pad = ids["pad_token_id"]
    ii = torch.tensor([s + [pad] * (L - len(s)) for s in seqs], device=device)
    lab = torch.tensor([s + [-100] * (L - len(s)) for s in labels], device=device)
    am = torch.tensor([[1] * len(s) + [0] * (L - len(s)) for s in seqs], device=device)
    pv = device_patches(np.stack([item[0] for item in batch]), device)
    return {"input_ids": ii, "labels": lab, "attention_mask": am, "pixel_values": pv,
            "image_grid_thw": torch.tensor([[1, 64, 64]] * len(batch), device=device),
            "mm_token_type_ids": (ii == ids["image_token_id"]).int()}


def device_patches(canvases: np.ndarray, device) -> "torch.Tensor":
    """uint8 [B, S, S, 3] -> [B*N, 3*16*16] float32: edgeocr.preprocess normalize + patchify, on `device`."""
    import torch

    from edgeocr.preprocess import _LUT

    x = torch.from_numpy(canvases).to(device, non_blocking=True).permute(0, 3, 1, 2).long()   # [B, 3, S, S]
    lut = torch.from_numpy(np.ascontiguousarray(_LUT)).to(device)                            # [3, 256]
    v = lut[torch.arange(3, device=device)[None, :, None, None], x]
    b, c, s, _ = v.shape
    g, p = s // 16, 16
    return v.reshape(b, c, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(b * g * g, c * p * p).contiguous()


def eval_pages(model_dir: Path, n: int, tokens: int = 700, device: str | None = None,
               dtype: str | None = None) -> list[dict]:
    """Full text of the first `n` calibration_data/eval pages through the transformers reference (greedy,
    the checkpoint's repetition penalty), page by page: image, CER, tokens generated, text."""
    from edgeocr import metrics
    from edgeocr.dataset import load_dir
    from edgeocr.decode import DecodeOptions
    from quantize.reference import TransformersRunner

    runner = TransformersRunner(str(model_dir), device or ("cuda" if _cuda() else "cpu"), dtype=dtype)
    root = Path(__file__).resolve().parents[1] / "calibration_data" / "eval"
    rows = []
    for s in load_dir(root)[:n]:
        r = runner.recognize(s.path, task="structured_parse", options=DecodeOptions(max_new_tokens=tokens))
        rows.append({"image": s.path.name, "cer": metrics.cer(r.text, s.text), "tokens": r.generated_tokens,
                     "text": r.text})
    return rows


def evaluate(model_dir: Path, n: int, tokens: int = 700) -> dict:
    """Mean CER of the current checkpoint on calibration_data/eval (the training log's eval_cer)."""
    cers = [r["cer"] for r in eval_pages(model_dir, n, tokens)]
    return {"eval_cer": float(np.mean(cers)), "eval_images": len(cers)}


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def train(out: Path, cfg: TrainConfig, device: str, resume: bool, log=print, *,
          gpu_seconds: float | None = None, budget_s: float | None = None, init: Path | None = None,
          steps_given: bool = True, tokenizer: Path | None = None) -> Path:
    """Train into `out`; returns the checkpoint folder.  See the module doc for the time options."""
    import multiprocessing as mp

    import torch
    from tokenizers import Tokenizer

    out.mkdir(parents=True, exist_ok=True)
    state_path, log_path = out / "train_state.pt", out / "train_log.jsonl"
    model, ids = make_model(cfg, out, init, tokenizer)
    tok = Tokenizer.from_file(str(out / "checkpoint" / "tokenizer.json"))
    model.to(device)
    glyph = GlyphLoss(model, cfg.hidden, device) if cfg.glyph_loss > 0 else None
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    other = [p for n, p in model.named_parameters() if p.ndim < 2]
    if glyph is not None:
        decay.append(glyph.head.weight)
        other.append(glyph.head.bias)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.98))
    # the schedule runs on steps (--steps), or on training seconds (--gpu-seconds): then learning-rate
    # decay, curriculum and the end follow the time trained, so the run ends on time whatever the speed
    by_time = bool(gpu_seconds) and not steps_given
    step, total, trained_s = 0, (None if by_time else cfg.steps), 0.0
    if resume and state_path.exists():
        st = torch.load(state_path, map_location=device, weights_only=False)
        model.load_state_dict(st["model"])
        if glyph is not None and "glyph_head" in st:
            glyph.head.load_state_dict(st["glyph_head"])
        opt.load_state_dict(st["opt"])
        step, trained_s = st["step"], st.get("trained_s", 0.0)
        if not steps_given:             # keep the first invocation's schedule (time or steps); --steps overrides it
            if st.get("gpu_seconds"):
                by_time, gpu_seconds, total = True, st["gpu_seconds"], None
            else:
                total = st.get("total_steps") or total
        log(f"resumed at step {step}" + (f" of {total}" if total else f", {trained_s:.0f} of {gpu_seconds:.0f} s"))
    (out / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2))
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f}M parameters; batch {cfg.batch}; device {device}")
    amp = torch.autocast(device_type="cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    pool = mp.get_context("fork").Pool(cfg.workers) if cfg.workers > 1 else None
    start = time.perf_counter()

    def progress() -> float:            # share of the run done, 0..1
        return min(1.0, trained_s / gpu_seconds) if by_time else min(1.0, step / total)

    def schedule():                     # (share of reading pages, curriculum level) for the next pages
        frac, level = cfg.reading_frac, 1.0
        if cfg.curriculum:
            level = min(1.0, progress() / cfg.curriculum)
            frac = 0.9 + (cfg.reading_frac - 0.9) * level
        return frac, level

    feed = PageFeed(cfg, pool, schedule, start_step=step)

    def save_state():
        model.save_pretrained(out / "checkpoint")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "total_steps": total,
                    "gpu_seconds": gpu_seconds if by_time else None,
                    "glyph_head": glyph.head.state_dict() if glyph is not None else None,
                    "trained_s": trained_s, "config": asdict(cfg)}, state_path)

    model.train()
    with open(log_path, "a") as lf:
        while progress() < 1.0:
            if budget_s is not None and time.perf_counter() - start > budget_s:
                save_state()
                log(f"budget of {budget_s:.0f} s reached at step {step}; state saved, continue with --resume")
                break
            t_step = time.perf_counter()
            lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * progress()))
            for g in opt.param_groups:
                g["lr"] = lr
            batch = feed.take()
            inputs = collate(batch, ids, tok, cfg, device)
            with amp:
                loss = model(**inputs).loss
                glyph_v = glyph(batch) if glyph is not None else None
            if glyph_v is not None:
                loss_text = loss.detach()                  # read after the step (no extra sync here)
                loss = loss + cfg.glyph_loss * glyph_v
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            loss_v = float(loss.detach())              # synchronizes: the step time below is real
            dt = time.perf_counter() - t_step
            trained_s += dt
            rec = {"step": step, "loss": round(loss_v, 4), "lr": lr, "step_s": round(dt, 3),
                   "elapsed_s": round(trained_s, 1), "render_wait_s": round(feed.wait_s, 1)}
            if glyph_v is not None:          # loss = text loss + W x glyph loss
                rec.update(loss_text=round(float(loss_text), 4), loss_glyph=round(float(glyph_v.detach()), 4))
            if step % 10 == 0 or step == 1:
                log(f"step {step}{f'/{total}' if total else ''} ({progress():.1%}) loss {loss_v:.4f} lr {lr:.2e} "
                    f"({trained_s:.0f} s, {dt * 1000:.0f} ms/step, {feed.wait_s:.0f} s waiting for pages)")
            final = progress() >= 1.0
            saved = step % cfg.save_every == 0 or final
            if saved:
                save_state()
            if cfg.eval_every and (step % cfg.eval_every == 0 or final):
                if not saved:
                    model.save_pretrained(out / "checkpoint")      # evaluation reads this checkpoint
                model.eval()
                rec.update(evaluate(out / "checkpoint", cfg.eval_images, cfg.eval_tokens))
                log(f"step {step}: eval CER {rec['eval_cer']:.3f} on {rec['eval_images']} eval pages")
                model.train()
            lf.write(json.dumps(rec) + "\n")
            lf.flush()
    if pool:
        pool.terminate()
    if progress() >= 1.0:
        model.to(torch.bfloat16).save_pretrained(out / "checkpoint")
        log(f"done: {step} steps, {trained_s:.0f} s of training; checkpoint in {out / 'checkpoint'}")
    return out / "checkpoint"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m quantize.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, help=f"optimizer steps (default {TrainConfig.steps}; on --resume, the "
                    "first invocation's count)")
    ap.add_argument("--init", type=Path, help="start from this checkpoint (one this script trained) instead of "
                    "random weights")
    ap.add_argument("--reading-frac", type=float, default=TrainConfig.reading_frac,
                    help="share of random-line reading pages among the training pages")
    ap.add_argument("--tokenizer", type=Path, help="use this tokenizer.json instead of building one (saves "
                    "~1 min of rendering the tokenizer corpus; this script's own gives the same model)")
    ap.add_argument("--data-seed", type=int, default=TrainConfig.data_seed)
    ap.add_argument("--curriculum", type=float, default=TrainConfig.curriculum,
                    help="share of the run spent growing reading pages from large type to full pages")
    ap.add_argument("--gpu-seconds", type=float, help="run the schedule on this many seconds of training instead of --steps")
    ap.add_argument("--budget-s", type=float, help="stop this invocation after S seconds, state saved")
    ap.add_argument("--eval-images", type=int, default=TrainConfig.eval_images)
    ap.add_argument("--batch", type=int, default=TrainConfig.batch)
    ap.add_argument("--reuse", type=int, default=TrainConfig.reuse,
                    help="render batch/R new pages per step, the rest replayed from recent pages (default 1: all new)")
    ap.add_argument("--glyph-loss", type=float, default=TrainConfig.glyph_loss,
                    help="weight of the encoder's per-cell character loss (teaches glyphs directly; 0 = off)")
    ap.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 15))
    ap.add_argument("--eval-every", type=int, default=TrainConfig.eval_every)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="very small sizes (tests)")
    args = ap.parse_args(argv)
    cfg = TrainConfig(steps=args.steps or TrainConfig.steps, batch=args.batch, reading_frac=args.reading_frac,
                      data_seed=args.data_seed, curriculum=args.curriculum, workers=args.workers, reuse=args.reuse,
                      glyph_loss=args.glyph_loss,
                      eval_every=args.eval_every,
                      eval_images=args.eval_images)
    if args.tiny:
        cfg = TrainConfig(**dict(asdict(cfg), hidden=64, layers=1, heads=2, kv_heads=1, head_dim=32, intermediate=128,
                                 v_hidden=32, v_layers=1, v_heads=2, v_intermediate=64, bpe_vocab=400,
                                 eval_images=1, max_target_tokens=64))
    train(args.out, cfg, args.device, args.resume, log=lambda s: print(s, file=sys.stderr, flush=True),
          gpu_seconds=args.gpu_seconds, budget_s=args.budget_s, init=args.init, tokenizer=args.tokenizer,
          steps_given=args.steps is not None or (not args.gpu_seconds and not args.resume))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
