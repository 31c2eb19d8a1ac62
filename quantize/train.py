"""Train a small HunyuanVL-architecture OCR model on synthetic business documents (issue 8).

    python -m quantize.train OUT [--steps 3000] [--batch 16] [--device cuda] [--resume]

transformers' own HunYuanVLForConditionalGeneration (so the checkpoint has the real format), its own
byte-level BPE tokenizer.json with the real special-token names, documents from the calibration_data
generator rendered at the runtime's 1024x1024 letterboxed input, the official prompts for full text
(structured_parse) and spotting (0-1000 boxes of the canvas).  Seeded and resumable (OUT/train_state.pt);
progress and a loss/CER log in OUT/train_log.jsonl; the final checkpoint in OUT/checkpoint.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgeocr import prompts
from edgeocr.preprocess import CANVAS, letterbox, normalize, patchify

TASKS = ("structured_parse", "spotting")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 3000                 # optimizer steps
    batch: int = 16                   # documents per step
    lr: float = 1.5e-3                # peak learning rate (AdamW), cosine decay
    warmup: int = 150                 # linear warm-up steps
    weight_decay: float = 0.05
    seed: int = 0
    data_seed: int = 7000             # generator seed (calib uses 1001, eval 2002)
    workers: int = 8                  # document-rendering processes
    max_target_tokens: int = 640      # longer targets are cut (rare for these documents)
    eval_every: int = 250             # steps between CER evaluations on calibration_data/eval
    eval_images: int = 8
    save_every: int = 250             # steps between resumable checkpoints
    bpe_vocab: int = 3000             # BPE entries before the special tokens
    # model sizes: keep the checkpoint <= 12 MB in bf16 (about 6M parameters)
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 768
    v_hidden: int = 192
    v_layers: int = 4
    v_heads: int = 4
    v_intermediate: int = 576
    max_image_size: int = 1024        # position grid 64x64: the runtime's grid, no resize needed


def canvas_target(rec: dict, lb, task: str) -> str:
    """Target string for `task`; spotting boxes in 0..1000 of the letterboxed canvas."""
    if task == "structured_parse":
        return rec["text"]
    k = lb.scale * 1000 / CANVAS
    out = []
    for ln in rec["lines"]:
        x1, y1, x2, y2 = ln["box"]
        b = [min(1000, int(v * k)) for v in (x1, y1, x2, y2)]
        out.append(f"{ln['text']}({b[0]},{b[1]}),({b[2]},{b[3]})")
    return "".join(out)


def render(args) -> tuple[np.ndarray, str, str]:
    """Worker: document index -> (canvas uint8 [S, S, 3], task, target)."""
    index, seed = args
    from quantize.docgen import GenOptions, make_document
    img, rec = make_document(index, seed, GenOptions(degrade_prob=0.6))
    canvas, lb = letterbox(img)
    task = TASKS[index % len(TASKS)]
    return canvas, task, canvas_target(rec, lb, task)


def build_corpus(n: int, seed: int) -> list[str]:
    from quantize.docgen import GenOptions, make_document
    texts = list(prompts.TASKS_ZH.values()) + list(prompts.TASKS_EN.values())
    for i in range(n):
        _, rec = make_document(i, seed, GenOptions(degrade=False))
        texts.append(rec["text"])
    return texts


def make_model(cfg: TrainConfig, out: Path):
    import torch
    from transformers import GenerationConfig, HunYuanVLConfig, HunYuanVLForConditionalGeneration

    from quantize.tokenizer_build import build_tokenizer, special_ids, tokenizer_config

    tok = build_tokenizer(build_corpus(600, cfg.data_seed + 99), cfg.bpe_vocab)
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
    seqs, labels, pix = [], [], []
    for canvas, task, target in batch:
        p = prompts.build_prompt_ids(ptoks, n_img, tok.encode(prompts.task_prompt(task)).ids)
        t = tok.encode(target).ids[: cfg.max_target_tokens] + [ids["eos_token_id"]]
        seqs.append(p + t)
        labels.append([-100] * len(p) + t)
        pix.append(patchify(normalize(canvas)))
    L = max(map(len, seqs))
    pad = ids["pad_token_id"]
    ii = torch.tensor([s + [pad] * (L - len(s)) for s in seqs], device=device)
    lab = torch.tensor([s + [-100] * (L - len(s)) for s in labels], device=device)
    am = torch.tensor([[1] * len(s) + [0] * (L - len(s)) for s in seqs], device=device)
    pv = torch.from_numpy(np.concatenate(pix)).to(device)
    return {"input_ids": ii, "labels": lab, "attention_mask": am, "pixel_values": pv,
            "image_grid_thw": torch.tensor([[1, 64, 64]] * len(batch), device=device),
            "mm_token_type_ids": (ii == ids["image_token_id"]).int()}


def evaluate(model_dir: Path, n: int) -> dict:
    """CER of the current checkpoint on calibration_data/eval, through the transformers reference."""
    from edgeocr import metrics
    from edgeocr.dataset import load_dir
    from edgeocr.decode import DecodeOptions
    from edgeocr.reference import TransformersRunner

    runner = TransformersRunner(str(model_dir), "cuda" if _cuda() else "cpu")
    root = Path(__file__).resolve().parents[1] / "calibration_data" / "eval"
    cers = []
    for s in load_dir(root)[:n]:
        r = runner.recognize(s.path, task="structured_parse", options=DecodeOptions(max_new_tokens=700))
        cers.append(metrics.cer(r.text, s.text))
    return {"eval_cer": float(np.mean(cers)), "eval_images": len(cers)}


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def train(out: Path, cfg: TrainConfig, device: str, resume: bool, log=print) -> Path:
    import multiprocessing as mp

    import torch
    from tokenizers import Tokenizer

    out.mkdir(parents=True, exist_ok=True)
    state_path, log_path = out / "train_state.pt", out / "train_log.jsonl"
    model, ids = make_model(cfg, out)
    tok = Tokenizer.from_file(str(out / "checkpoint" / "tokenizer.json"))
    model.to(device)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    other = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.98))
    step = 0
    if resume and state_path.exists():
        st = torch.load(state_path, map_location=device, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step = st["step"]
        log(f"resumed at step {step}")
    (out / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2))
    amp = torch.autocast(device_type="cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    ctx = mp.get_context("fork")
    pool = ctx.Pool(cfg.workers) if cfg.workers > 1 else None
    t0 = time.perf_counter()

    def batches(start_step):
        i = start_step * cfg.batch
        while True:
            jobs = [(i + k, cfg.data_seed) for k in range(cfg.batch)]
            yield pool.map(render, jobs) if pool else [render(j) for j in jobs]
            i += cfg.batch

    it = batches(step)
    model.train()
    with open(log_path, "a") as lf:
        while step < cfg.steps:
            lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
            for g in opt.param_groups:
                g["lr"] = lr
            inputs = collate(next(it), ids, tok, cfg, device)
            with amp:
                loss = model(**inputs).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            rec = {"step": step, "loss": round(float(loss.detach()), 4), "lr": lr, "elapsed_s": round(time.perf_counter() - t0, 1)}
            if step % 10 == 0 or step == 1:
                log(f"step {step}/{cfg.steps} loss {rec['loss']:.4f} lr {lr:.2e} ({rec['elapsed_s']:.0f} s)")
            save = step % cfg.save_every == 0 or step == cfg.steps
            do_eval = bool(cfg.eval_every) and (step % cfg.eval_every == 0 or step == cfg.steps)
            if save or do_eval:
                model.save_pretrained(out / "checkpoint")      # evaluation reads this checkpoint
            if save:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, state_path)
            if do_eval:
                model.eval()
                rec.update(evaluate(out / "checkpoint", cfg.eval_images))
                log(f"step {step}: eval CER {rec['eval_cer']:.3f}")
                model.train()
            lf.write(json.dumps(rec) + "\n")
            lf.flush()
    if pool:
        pool.close()
    model.to(torch.bfloat16).save_pretrained(out / "checkpoint")
    return out / "checkpoint"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m quantize.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=TrainConfig.steps)
    ap.add_argument("--batch", type=int, default=TrainConfig.batch)
    ap.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 15))
    ap.add_argument("--eval-every", type=int, default=TrainConfig.eval_every)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="very small sizes (tests)")
    args = ap.parse_args(argv)
    cfg = TrainConfig(steps=args.steps, batch=args.batch, workers=args.workers, eval_every=args.eval_every)
    if args.tiny:
        cfg = TrainConfig(**dict(asdict(cfg), hidden=64, layers=1, heads=2, kv_heads=1, head_dim=32, intermediate=128,
                                 v_hidden=32, v_layers=1, v_heads=2, v_intermediate=64, bpe_vocab=400,
                                 eval_images=1, max_target_tokens=64))
    train(args.out, cfg, args.device, args.resume, log=lambda s: print(s, file=sys.stderr, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
