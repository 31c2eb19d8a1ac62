"""The transformers reference (HunYuanVLForConditionalGeneration, FP32, eager) driven with exactly
the runtime's inputs: the same letterboxed canvas, prompt ids and decoding contract."""

from __future__ import annotations

import functools

import numpy as np
import torch

from edgeocr import preprocess


@functools.lru_cache(maxsize=4)
def load(ckpt) -> "torch.nn.Module":
    from transformers import HunYuanVLForConditionalGeneration
    return HunYuanVLForConditionalGeneration.from_pretrained(ckpt, attn_implementation="eager",
                                                             dtype=torch.float32).eval()


def inputs(model, pixels: np.ndarray, ids: np.ndarray) -> dict:
    """pixels: [1, 3, S, S] normalized canvas; ids: [L] prompt (+ generated) ids."""
    s = pixels.shape[-1]
    g = s // model.config.vision_config.patch_size
    pv = torch.from_numpy(preprocess.patchify(pixels, model.config.vision_config.patch_size).copy())
    ii = torch.from_numpy(np.asarray(ids, np.int64))[None]
    return {"input_ids": ii, "pixel_values": pv, "image_grid_thw": torch.tensor([[1, g, g]]),
            "mm_token_type_ids": (ii == model.config.image_token_id).int(), "attention_mask": torch.ones_like(ii)}


@torch.no_grad()
def image_embeds(model, pixels: np.ndarray) -> np.ndarray:
    x = inputs(model, pixels, np.zeros(1, np.int64))
    return model.model.get_image_features(x["pixel_values"], x["image_grid_thw"]).pooler_output[0].numpy()


@torch.no_grad()
def logits(model, pixels: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Teacher-forced logits [L, V] over the whole sequence in one forward."""
    return model(**inputs(model, pixels, ids)).logits[0].float().numpy()


@torch.no_grad()
def generate(model, pixels, ids, max_new_tokens: int, stop_ids, penalty: float) -> list[int]:
    out = model.generate(**inputs(model, pixels, ids), max_new_tokens=max_new_tokens, do_sample=False,
                         repetition_penalty=penalty, eos_token_id=list(stop_ids), pad_token_id=stop_ids[0])
    return out[0, len(ids):].tolist()
