"""The model being trained: transformers' HunYuanVLForConditionalGeneration, fresh (with a byte-level BPE
tokenizer learned on generator text, the real special-token names) or continued from a checkpoint.
The checkpoint folder OUT/checkpoint is always in transformers' format with tokenizer and generation config.
"""

from __future__ import annotations

import json
from pathlib import Path

from edgeocr import prompts
from quantize.train.config import TrainConfig


def build_corpus(n: int, seed: int) -> list[str]:
    from quantize.docgen import GenOptions, make_document
    texts = list(prompts.TASKS_ZH.values()) + list(prompts.TASKS_EN.values())
    for i in range(n):
        _, rec = make_document(i, seed, GenOptions(degrade=False))
        texts.append(rec["text"])
    return texts


def make_model(cfg: TrainConfig, out: Path, init: Path | None = None, tokenizer: Path | None = None):
    """A fresh model and tokenizer written to out/checkpoint, or (init) the weights, tokenizer and generation
    config of a HunyuanVL checkpoint (e.g. the shipped demo_model/), to train further.  Returns (model in
    float32, special token ids)."""
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
    if tokenizer is not None:                   # reuse a tokenizer.json (the trainer's own, same seed: identical)
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
