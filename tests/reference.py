"""The transformers reference (HunYuanVLForConditionalGeneration, FP32, eager) for the parity tests: the
same builders as quantize.reference, cached per checkpoint."""

from __future__ import annotations

import functools

from quantize.reference import generate, image_embeds, inputs, logits  # noqa: F401  (used by the tests)
from quantize.reference import load as _load


@functools.lru_cache(maxsize=4)
def load(ckpt):
    return _load(ckpt)
