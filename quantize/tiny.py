"""Tiny random-weight HunyuanVL checkpoints, made with transformers' own `hunyuan_vl`.

They are saved with `save_pretrained`, so tensor names, config layout and generation_config are
the real on-disk format; the tokenizer is a small byte-level BPE in the real tokenizer.json format
with the real special-token names.  Used by the tests and by the README's first command.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from edgeocr.artifact import DEFAULT_REPETITION_PENALTY
from edgeocr.prompts import TASKS_EN, TASKS_ZH
from quantize.tokenizer_build import build_tokenizer, special_ids, tokenizer_config

log = logging.getLogger("edgeocr.quantize")

_CORPUS_EXTRA = [
    "INVOICE Invoice No. Date Total Amount Due Tax Subtotal Qty Unit Price Description",
    "发票 增值税 专用发票 金额 税额 价税合计 大写 小写 开票日期 购买方 销售方 名称 纳税人识别号",
    "Receipt Cash Change Thank you for shopping Store Tel Address Ship To From Tracking",
    "SPECIMEN ID Card Name Sex Nationality Date of Birth Address Issue Expiry 姓名 性别 民族 出生 住址",
    "Menu 菜单 Soup Rice Noodles Tea Coffee 汤 米饭 面条 茶 咖啡 ¥ $ € 12.50 0.00 100.00 2026-12-02",
    "壹 贰 叁 肆 伍 陆 柒 捌 玖 拾 佰 仟 万 亿 圆 角 分 整 0123456789 +86 138 0013 8000",
    "The quick brown fox jumps over the lazy dog. HELLO WORLD 2026 (1,2),(3,4) [\"box\": \"text\"]",
]


@dataclass(frozen=True)
class TinyConfig:
    """Sizes of one tiny test model.  Keep hidden != heads * head_dim, like the real model."""

    name: str
    bpe_vocab: int           # BPE entries before the specials
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tie: bool
    v_hidden: int
    v_intermediate: int
    v_layers: int
    v_heads: int
    max_image_size: int      # position grid edge = max_image_size / 16
    extra_vocab: int = 0     # config vocab_size beyond the tokenizer (real checkpoints have 0)


TINY_A = TinyConfig("tiny-a", bpe_vocab=400, hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2,
                    head_dim=32, tie=True, v_hidden=48, v_intermediate=96, v_layers=2, v_heads=4,
                    max_image_size=256)
TINY_B = TinyConfig("tiny-b", bpe_vocab=700, hidden=96, intermediate=160, layers=3, heads=6, kv_heads=1,
                    head_dim=24, tie=False, v_hidden=32, v_intermediate=64, v_layers=1, v_heads=2,
                    max_image_size=512, extra_vocab=5)


def corpus() -> list[str]:
    return list(TASKS_ZH.values()) + list(TASKS_EN.values()) + _CORPUS_EXTRA


def hf_config(tc: TinyConfig, ids: dict[str, int], vocab_size: int):
    from transformers import HunYuanVLConfig

    q = tc.head_dim // 8
    text = dict(
        vocab_size=vocab_size, hidden_size=tc.hidden, intermediate_size=tc.intermediate,
        num_hidden_layers=tc.layers, num_attention_heads=tc.heads, num_key_value_heads=tc.kv_heads,
        head_dim=tc.head_dim, max_position_embeddings=8192, rms_norm_eps=1e-5,
        tie_word_embeddings=tc.tie, bos_token_id=ids["bos_token_id"], eos_token_id=ids["eos_token_id"],
        pad_token_id=ids["pad_token_id"], eod_token_id=ids["eod_token_id"], rope_theta=10000.0,
        rope_scaling={"type": "xdrope", "alpha": 1000.0, "factor": 1.0, "xdrope_section": [q, q, q, q]},
    )
    vision = dict(
        hidden_size=tc.v_hidden, intermediate_size=tc.v_intermediate, num_hidden_layers=tc.v_layers,
        num_attention_heads=tc.v_heads, patch_size=16, spatial_merge_size=2,
        max_image_size=tc.max_image_size, out_hidden_size=tc.hidden, rms_norm_eps=1e-5,
    )
    return HunYuanVLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tc.tie,
                           image_token_id=ids["image_token_id"], im_start_id=ids["im_start_id"],
                           im_end_id=ids["im_end_id"], im_newline_id=ids["im_newline_id"])


def make_tiny_checkpoint(out: Path, tc: TinyConfig = TINY_A, seed: int = 0, *, flat_config: bool = False,
                         max_shard_size: str | None = None, init_std: float = 0.25) -> Path:
    """Build, randomly initialize and save a tiny HunyuanVL checkpoint in `out`.

    init_std: weights are re-drawn from N(0, init_std) so that logits are far from flat (transformers'
    default init of 0.02 gives near-uniform logits whose argmax is decided by noise).
    flat_config: rewrite config.json in Tencent's flat layout (text fields at the top level).
    """
    import torch
    from transformers import GenerationConfig, HunYuanVLForConditionalGeneration

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(corpus(), tc.bpe_vocab)
    ids = special_ids(tok)
    vocab = tok.get_vocab_size(with_added_tokens=True) + tc.extra_vocab
    cfg = hf_config(tc, ids, vocab)
    torch.manual_seed(seed)
    model = HunYuanVLForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = "norm" in name.split(".")[-2] or name.endswith("_rms.weight")
            if is_norm and name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif is_norm:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[1] if p.ndim >= 2 else p.shape[0]
                if p.ndim == 4:
                    fan_in = p.shape[1] * p.shape[2] * p.shape[3]
                std = init_std if p.ndim == 1 or "embed" in name or "lm_head" in name else 1.0 / fan_in ** 0.5
                p.copy_(std * torch.randn(p.shape, generator=g))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kwargs)
    gen = GenerationConfig(bos_token_id=ids["bos_token_id"], pad_token_id=ids["pad_token_id"],
                           eos_token_id=[ids["eos_token_id"], ids["eod_token_id"]], do_sample=False,
                           repetition_penalty=DEFAULT_REPETITION_PENALTY)
    gen.save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tok), ensure_ascii=False, indent=2))
    if flat_config:
        c = json.loads((out / "config.json").read_text())
        text = c.pop("text_config")
        text.pop("model_type", None)
        c.update(text)
        (out / "config.json").write_text(json.dumps(c, indent=2))
    log.info("tiny checkpoint %s (%s params) written to %s", tc.name,
             f"{sum(p.numel() for p in model.parameters()):,}", out)
    return out
