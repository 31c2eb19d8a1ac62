"""The real HunyuanOCR architecture (spec §1 numbers) on random weights, for sizes and speed.

    python -m quantize.realsize OUT [--dtype bfloat16]

The tokenizer is a small byte-level BPE (the real 120,818-entry tokenizer is not needed for sizes and speed), so
special-token ids differ from the real ones; every size, shape and the vocabulary width are real.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from edgeocr.artifact import DEFAULT_REPETITION_PENALTY
from quantize.tiny import corpus
from quantize.tokenizer_build import build_tokenizer, special_ids, tokenizer_config

REAL_TEXT = dict(vocab_size=120818, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                 rms_norm_eps=1e-5, tie_word_embeddings=True, rope_theta=10000.0,
                 rope_scaling={"type": "xdrope", "alpha": 1000.0, "factor": 1.0, "beta_fast": 32, "beta_slow": 1,
                               "mscale": 1.0, "mscale_all_dim": 1.0, "xdrope_section": [16, 16, 16, 16]})
REAL_VISION = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                   patch_size=16, spatial_merge_size=2, max_image_size=2048, out_hidden_size=1024, rms_norm_eps=1e-5,
                   interpolate_mode="bilinear")


def make_realsize_checkpoint(out: Path, dtype: str = "bfloat16", seed: int = 0) -> Path:
    import torch
    from transformers import GenerationConfig, HunYuanVLConfig, HunYuanVLForConditionalGeneration

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(corpus(), 400)
    ids = special_ids(tok)
    text = dict(REAL_TEXT, bos_token_id=ids["bos_token_id"], eos_token_id=ids["eos_token_id"],
                pad_token_id=ids["pad_token_id"], eod_token_id=ids["eod_token_id"])
    cfg = HunYuanVLConfig(text_config=text, vision_config=REAL_VISION, tie_word_embeddings=True,
                          image_token_id=ids["image_token_id"], im_start_id=ids["im_start_id"],
                          im_end_id=ids["im_end_id"], im_newline_id=ids["im_newline_id"])
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    model = HunYuanVLForConditionalGeneration(cfg).to(getattr(torch, dtype)).eval()
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    GenerationConfig(bos_token_id=ids["bos_token_id"], pad_token_id=ids["pad_token_id"],
                     eos_token_id=[ids["eos_token_id"], ids["eod_token_id"]], do_sample=False,
                     repetition_penalty=DEFAULT_REPETITION_PENALTY).save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tok), ensure_ascii=False, indent=2))
    print(f"real-size HunyuanVL: {n:,} parameters ({dtype}) -> {out} in {time.perf_counter() - t0:.0f} s")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m quantize.realsize", description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = ap.parse_args(argv)
    make_realsize_checkpoint(args.out, args.dtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
