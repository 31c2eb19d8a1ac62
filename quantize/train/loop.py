"""The training loop: pool -> on-device batch -> augmentation -> batched forward -> AdamW, on a step or a
time schedule, resumable, measured.

Per step the host draws the batch's indices (seeded by the step) and launches kernels; nothing is
rendered, stacked, pickled or copied from the host but a few hundred index bytes (pinned, asynchronous),
and the host waits for the device only every `log_every` steps, when the losses are read.  On CUDA: bf16
autocast, torch sdpa attention, fused AdamW, optional torch.compile of the forward.

The schedule runs on steps (`--steps N`) or on training seconds (`--gpu-seconds S`): then learning-rate
decay and the end follow the seconds trained (kept in the resumable state), so a run ends after S seconds
with its learning rate decayed whatever the machine's speed.  `--budget-s B` stops an invocation after B
seconds (pool included) with the state saved; `--resume` continues it.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quantize.train.config import TrainConfig

log = logging.getLogger("quantize.train")


@dataclass(frozen=True)
class RunOptions:
    device: str = "cuda"                 # training device
    resume: bool = False                 # continue OUT/train_state.pt
    init: Path | None = None             # start from this checkpoint's weights and tokenizer
    tokenizer: Path | None = None        # fresh model: this tokenizer.json instead of building one
    gpu_seconds: float | None = None     # schedule on seconds of training instead of steps
    steps_given: bool = True             # --steps was given (it overrides a resumed run's schedule)
    budget_s: float | None = None        # stop this invocation after this many seconds, state saved
    page_dirs: tuple[str, ...] = ()      # extra labelled page folders for the pool
    compile: bool = False                # torch.compile the forward
    pool_cache: Path | None = None       # where the page pool is cached (default OUT/pool); runs of one
                                         # recipe can share it


def pool_spec(cfg: TrainConfig, opts: RunOptions):
    """The page pool a run draws from: fixed by the data flags alone (generator seed and share, folders, target
    cut, shift draws seeded by data_seed), not by --seed, so that a run continuing another with a new --seed
    (other page draws and augmentation) loads the same cached pool."""
    from quantize.train.pool import PoolSpec
    return PoolSpec(generated=cfg.pool_pages, data_seed=cfg.data_seed, reading_frac=cfg.reading_frac,
                    degrade_prob=cfg.degrade_prob, dirs=tuple(str(d) for d in opts.page_dirs), shifts=cfg.shifts,
                    max_shift=cfg.max_shift, max_target_tokens=cfg.max_target_tokens, glyph_chars=cfg.glyph_chars,
                    seed=cfg.data_seed, reading_levels=tuple(cfg.reading_levels))


class _Staging:
    """A ring of pinned host buffers for the per-step index upload (a buffer is reused only after its
    copy has completed), or plain tensors off CUDA."""

    def __init__(self, device: str, n: int = 4):
        import torch
        self.device, self.cuda = device, device.startswith("cuda")
        self.ring = [None] * n
        self.k = 0
        self.torch = torch

    def __call__(self, arrays: list[np.ndarray]) -> list:
        torch = self.torch
        if not self.cuda:
            return [torch.from_numpy(a) for a in arrays]
        slot = self.ring[self.k]
        self.k = (self.k + 1) % len(self.ring)
        stacked = np.stack(arrays).astype(np.int64)
        if slot is None or slot[0].shape != stacked.shape:
            slot = [torch.empty(stacked.shape, dtype=torch.int64).pin_memory(), torch.cuda.Event()]
            self.ring[(self.k - 1) % len(self.ring)] = slot
        else:
            slot[1].synchronize()
        slot[0].numpy()[...] = stacked
        dev = slot[0].to(self.device, non_blocking=True)
        slot[1].record()
        return list(dev.unbind(0))


def qk_norm_weights(model) -> list:
    """The decoder's query/key RMSNorm weights (QK-norm after RoPE: they set how sharp attention can be)."""
    return [p for layer in model.model.language_model.layers
            for p in (layer.self_attn.query_layernorm.weight, layer.self_attn.key_layernorm.weight)]


def attention_logit_cap(model) -> float:
    """The largest attention logit the decoder's QK-norm allows: max over layers of
    sum_d |g_q[d] g_k[d]| * scaling (unit-RMS query and key rows, perfectly aligned)."""
    caps = []
    for layer in model.model.language_model.layers:
        att = layer.self_attn
        g = (att.query_layernorm.weight * att.key_layernorm.weight).abs()
        caps.append(float(g.max()) * att.head_dim * att.scaling)
    return max(caps)


def train(out: Path, cfg: TrainConfig, opts: RunOptions) -> Path:
    """Train into `out`; returns the checkpoint folder."""
    import torch
    from tokenizers import Tokenizer

    from quantize.train import augment
    from quantize.train.batch import Prompts, Sampler
    from quantize.train.forward import BatchedHunYuanVL
    from quantize.train.glyph import GlyphHead, load_glyph_head, save_glyph_head
    from quantize.train.measure import GpuBusy, RunSummary
    from quantize.train.model import make_model
    from quantize.train.pages import charset_index
    from quantize.train.pool import build_pool

    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    state_path, log_path = out / "train_state.pt", out / "train_log.jsonl"
    device = opts.device
    cuda = device.startswith("cuda")
    torch.manual_seed(cfg.seed)
    init = opts.init
    if opts.resume and state_path.exists() and (out / "checkpoint" / "config.json").exists():
        init = out / "checkpoint"                 # a resumed run keeps its own architecture and tokenizer
    model, ids = make_model(cfg, out, init, opts.tokenizer)
    tok = Tokenizer.from_file(str(out / "checkpoint" / "tokenizer.json"))
    model.to(device)
    vc = model.config.vision_config
    grid = 1024 // (vc.patch_size * vc.spatial_merge_size)
    glyph = GlyphHead(model.config.text_config.hidden_size, len(charset_index()), grid).to(device) \
        if cfg.glyph_loss > 0 else None
    # a stage that continues a checkpoint continues its glyph head too (saved beside the weights); a fresh head on
    # a trained encoder starts at a loss near 18, and until it has learned, its gradients would reach the encoder
    glyph_fresh = glyph is not None and init is not None and not load_glyph_head(glyph, Path(init))
    if glyph is not None and init is not None:
        log.info("glyph head: %s", f"fresh; the encoder gets no glyph gradient for the first {cfg.warmup} steps"
                 if glyph_fresh else f"continued from {init}")
    qk = qk_norm_weights(model)
    model_params = list(model.parameters())
    glyph_params = list(glyph.parameters()) if glyph is not None else []
    params = model_params + glyph_params
    decay = [p for p in params if p.ndim >= 2]
    other = [p for p in params if p.ndim < 2 and all(p is not q for q in qk)]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay, "lr_scale": 1.0},
              {"params": other, "weight_decay": 0.0, "lr_scale": 1.0},
              {"params": qk, "weight_decay": 0.0, "lr_scale": cfg.qk_gain_lr}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), fused=cuda)
    by_time = bool(opts.gpu_seconds) and not opts.steps_given
    gpu_seconds = opts.gpu_seconds
    step, total, trained_s = 0, (None if by_time else cfg.steps), 0.0
    resumed = opts.resume and state_path.exists()
    if resumed:
        st = torch.load(state_path, map_location=device, weights_only=False)
        model.load_state_dict(st["model"])
        if glyph is not None and st.get("glyph_head"):
            glyph.load_state_dict(st["glyph_head"])
            glyph_fresh = False
        opt.load_state_dict(st["opt"])
        step, trained_s = st["step"], st.get("trained_s", 0.0)
        if not opts.steps_given:            # keep the first invocation's schedule; --steps overrides it
            if st.get("gpu_seconds"):
                by_time, gpu_seconds, total = True, st["gpu_seconds"], None
            else:
                total = st.get("total_steps") or total
        for g in opt.param_groups:             # a state saved before the QK-norm group existed has none
            g.setdefault("lr_scale", 1.0)
        log.info("resumed at step %d%s", step,
                 f" of {total}" if total else f", {trained_s:.0f} of {gpu_seconds:.0f} s")
    if not resumed and cfg.qk_gain != 1.0:
        with torch.no_grad():
            for w in qk:
                w.mul_(cfg.qk_gain)
        log.info("decoder query/key norm weights x %g (attention logits up to %.0f)", cfg.qk_gain,
                 attention_logit_cap(model))
    (out / "train_config.json").write_text(json.dumps(cfg.to_json(), indent=2))
    log.info("model: %.2fM parameters; batch %d; device %s", sum(p.numel() for p in model.parameters()) / 1e6,
             cfg.batch, device)

    t_pool = time.perf_counter()
    spec = pool_spec(cfg, opts)
    pool = build_pool(spec, tok, ids["eos_token_id"], opts.pool_cache or out / "pool", device, cfg.workers)
    pool_s = time.perf_counter() - t_pool
    fwd = BatchedHunYuanVL(model, image_start=0)
    pr = Prompts(tok, ids, fwd.geo.image_tokens, device)
    fwd = BatchedHunYuanVL(model, image_start=pr.image_start)
    run_fwd = torch.compile(fwd) if opts.compile else fwd
    sampler = Sampler(pool, pr, cfg.batch, cfg.seed)
    staging = _Staging(device)
    first = pr.first_answer - 1
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    gen = torch.Generator(device=device)
    name = torch.cuda.get_device_name(torch.device(device)) if cuda else "cpu"
    busy = GpuBusy(torch.device(device).index or 0).start() if cuda else None
    recipe = {**cfg.to_json(), "init": str(opts.init) if opts.init else None,
              "gpu_seconds": gpu_seconds if by_time else None, "pages": list(opts.page_dirs), "compile": opts.compile}
    summary = RunSummary(out / "run_summary.json", recipe, device, name, continued=step > 0 or resumed)
    views_here, secs_here, steps_here = 0, 0.0, 0

    def progress() -> float:                # share of the run done, 0..1
        return min(1.0, trained_s / gpu_seconds) if by_time else min(1.0, step / total)

    def save_state() -> None:
        model.save_pretrained(out / "checkpoint")
        if glyph is not None:
            save_glyph_head(glyph, out / "checkpoint")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "total_steps": total,
                    "gpu_seconds": gpu_seconds if by_time else None,
                    "glyph_head": glyph.state_dict() if glyph is not None else None,
                    "trained_s": trained_s, "config": cfg.to_json()}, state_path)

    def flush(pending: list) -> None:       # one device sync: read the losses of the pending steps
        if not pending:
            return
        vals = torch.stack([torch.stack(p["t"]) for p in pending]).float().cpu().tolist()
        gpu = busy.mean(last=40) if busy is not None else None
        for p, v in zip(pending, vals):
            rec = p["rec"]
            rec["loss"] = round(v[0], 4)
            if glyph is not None:           # loss = text loss + W x glyph loss
                rec.update(loss_text=round(v[1], 4), loss_glyph=round(v[2], 4))
            if gpu is not None:
                rec["gpu_busy_pct"] = gpu
            lf.write(json.dumps(rec) + "\n")
        lf.flush()
        r = pending[-1]["rec"]
        log.info("step %d%s (%.1f%%) loss %.4f lr %.2e (%.0f s, %.0f ms/step, %.1f page views/s%s)", r["step"],
                 f"/{total}" if total else "", 100 * progress(), r["loss"], r["lr"], trained_s, 1000 * r["step_s"],
                 r["page_views_s"], f", GPU {gpu:.0f} % busy" if gpu is not None else "")
        summary.update(train_s=secs_here, steps=steps_here, page_views=views_here,
                       gpu_busy=busy.mean() if busy is not None else None, pool_s=pool_s)
        pending.clear()

    model.train()
    pending: list = []
    with open(log_path, "a") as lf:
        while progress() < 1.0:
            if opts.budget_s is not None and time.perf_counter() - t_start > opts.budget_s:
                flush(pending)
                save_state()
                log.info("budget of %.0f s reached at step %d; state saved, continue with --resume",
                         opts.budget_s, step)
                break
            t_step = time.perf_counter()
            lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * progress()))
            for g in opt.param_groups:
                g["lr"] = lr * g["lr_scale"]
            batch = sampler(step, staging)
            gen.manual_seed(cfg.seed * 1_000_003 + step)
            pixels = augment.to_pixels(batch.canvases, batch.shifts, cfg.augment, gen)   # [B, 3, S, S] float32
            with amp:
                o = run_fwd(batch.input_ids, batch.labels, pixels, first=first)
                loss = o.loss
                if glyph is not None:
                    # a fresh head on a trained encoder learns alone for the warm-up: the encoder gets no glyph
                    # gradient until the head's loss means something
                    emb = o.image_embeds.detach() if glyph_fresh and step < cfg.warmup else o.image_embeds
                    g_loss = glyph(emb, batch.chars, batch.shifts)
                    parts = [loss + cfg.glyph_loss * g_loss, loss.detach(), g_loss.detach()]
                    loss = parts[0]
                else:
                    parts = [loss]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            # the model and the glyph head are clipped apart: the head's gradient (large while it is fresh) must not
            # scale the model's down
            torch.nn.utils.clip_grad_norm_(model_params, cfg.clip)
            if glyph_params:
                torch.nn.utils.clip_grad_norm_(glyph_params, cfg.clip)
            opt.step()
            step += 1
            # the host waits for the device only at log steps (and at the end): step_s is the host's wall
            # time per step, exact over every log window, not per step
            synced = cuda and (step % cfg.log_every == 0 or step == 1 or (not by_time and step >= total))
            if synced:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t_step
            if cuda and not synced and by_time and trained_s + dt >= gpu_seconds:
                torch.cuda.synchronize()                    # the last step of a timed run: count all of it
                dt = time.perf_counter() - t_step
            trained_s += dt
            secs_here += dt
            steps_here += 1
            views_here += cfg.batch
            pending.append({"t": [x.detach() for x in parts], "rec": {
                "step": step, "lr": lr, "step_s": round(dt, 3), "elapsed_s": round(trained_s, 1),
                "page_views_s": round(views_here / max(secs_here, 1e-9), 2)}})
            final = progress() >= 1.0
            if step % cfg.log_every == 0 or step == 1 or final:
                flush(pending)
            saved = step % cfg.save_every == 0 or final
            if saved:
                flush(pending)
                save_state()
            if cfg.eval_every and (step % cfg.eval_every == 0 or final):
                from quantize.train.evaluate import evaluate
                flush(pending)
                if not saved:
                    model.save_pretrained(out / "checkpoint")      # evaluation reads this checkpoint
                model.eval()
                res = evaluate(out / "checkpoint", cfg.eval_images, cfg.eval_tokens)
                lf.write(json.dumps({"step": step, **res}) + "\n")
                log.info("step %d: eval CER %.3f on %d eval pages", step, res["eval_cer"], res["eval_images"])
                model.train()
        flush(pending)
    if busy is not None:
        busy.stop()
    done = progress() >= 1.0
    summary.update(train_s=secs_here, steps=steps_here, page_views=views_here,
                   gpu_busy=busy.mean() if busy is not None else None, pool_s=pool_s, finished=done)
    if done:
        model.to(torch.bfloat16).save_pretrained(out / "checkpoint")
        if glyph is not None:
            save_glyph_head(glyph, out / "checkpoint")
        log.info("done: %d steps, %.0f s of training; checkpoint in %s", step, trained_s, out / "checkpoint")
    return out / "checkpoint"
