"""The trainer's recipe: one frozen dataclass, saved with every run (OUT/train_config.json)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class TrainConfig:
    # schedule
    steps: int = 3000                 # optimizer steps (ignored when the run is scheduled on seconds)
    batch: int = 32                   # page views per step
    lr: float = 1.5e-3                # peak learning rate (AdamW), cosine decay to 0
    warmup: int = 150                 # linear warm-up steps
    weight_decay: float = 0.05        # on matrices only
    clip: float = 1.0                 # gradient-norm clip
    seed: int = 0                     # model init, page draws, augmentation (not the pool: data_seed fixes it)
    # page pool
    pool_pages: int = 8192            # generated pages rendered once per run (uint8 on the device, 3 MiB each)
    data_seed: int = 7000             # generator seed (calibration_data uses 1001, eval 2002)
    reading_frac: float = 0.2         # share of random-line reading pages among the generated pages
    reading_levels: tuple = (1.0, 1.0)  # reading pages' difficulty drawn uniformly from [lo, hi] (0 = a few
                                      # short lines in 36-96 px type, 1 = up to 600 characters at 12-44 px)
    degrade_prob: float = 0.5         # share of generated documents with the generator's scan/photo effects
    workers: int = 0                  # rendering processes (0 = every host core)
    shifts: int = 4                   # shifted variants per page (plus the unshifted one), targets pre-tokenized
    max_shift: int = 24               # largest shift, canvas pixels (never moves a labelled line off the canvas)
    augment: float = 0.5              # per page view, probability of each photometric augmentation
    max_target_tokens: int = 640      # longer targets are cut (and then carry no end token)
    glyph_chars: int = 2048           # characters per page kept for the glyph loss's targets
    # losses
    glyph_loss: float = 0.5           # weight of the encoder's per-cell character loss (0 = off); see glyph.py
    # decoder attention sharpness: with QK-norm after RoPE an attention logit is at most
    # head_dim * g_q * g_k * scaling = 8 g^2 at head_dim 64, too flat to pick one of 1,058 image tokens
    qk_gain: float = 1.0              # multiply the decoder's query/key norm weights by this at the start
                                      # of a run (fresh or --init; not on --resume)
    qk_gain_lr: float = 1.0           # learning-rate multiplier of those norm weights
    # bookkeeping
    eval_every: int = 250             # steps between CER evaluations on calibration_data/eval (0 = never)
    eval_images: int = 4
    eval_tokens: int = 700
    save_every: int = 250             # steps between resumable states
    log_every: int = 10               # steps between progress lines (every step goes to train_log.jsonl)
    # a fresh model (not --init): tokenizer and sizes; the demo model's: <= 12 MB in bf16
    tok_seed: int = 7099              # generator seed of the tokenizer's corpus
    bpe_vocab: int = 2200             # BPE entries before the special tokens
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

    def to_json(self) -> dict:
        return asdict(self)


def tiny(cfg: TrainConfig) -> TrainConfig:
    """Very small sizes for tests and CPU measurements (same code paths)."""
    return replace(cfg, hidden=64, layers=1, heads=2, kv_heads=1, head_dim=32, intermediate=128, v_hidden=32,
                   v_layers=1, v_heads=2, v_intermediate=64, bpe_vocab=400, eval_images=1, max_target_tokens=64,
                   glyph_chars=256)
