"""On-device augmentation of a whole batch, then the runtime's normalization.

Per page view, each with probability `p`: a shift (the placement the batch drew: its spotting target was
tokenized for exactly that shift, and the glyph targets move with it), brightness/contrast, a Gaussian
blur, Gaussian noise.  The result is rounded back to uint8 — a page is always a real 8-bit image — and
normalized with the runtime's own lookup table (edgeocr.preprocess), so training sees the pixels the
runtime would feed the encoder for that image.  All ops are batched tensor ops; the randomness comes from
a device generator seeded per step.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from edgeocr.preprocess import PAD_VALUE, _LUT

BLUR_TAPS = 5                  # separable Gaussian kernel width
MAX_SIGMA = 1.2                # strongest blur, canvas pixels
MAX_NOISE = 8.0                # strongest noise std, 8-bit levels


def shift(canvases: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """canvases: [B, S, S, 3] uint8; shifts: [B, 2] (dx, dy) -> content moved by (dx, dy), the uncovered
    border white: [B, S, S, 3] uint8."""
    b, s = canvases.shape[0], canvases.shape[1]
    r = torch.arange(s, device=canvases.device)
    rows = r[None, :] - shifts[:, 1:2].long()                                    # [B, S] source row
    cols = r[None, :] - shifts[:, 0:1].long()                                    # [B, S] source column
    bi = torch.arange(b, device=canvases.device)[:, None, None]
    out = canvases[bi, rows.clamp(0, s - 1)[:, :, None], cols.clamp(0, s - 1)[:, None, :]]   # [B, S, S, 3]
    inside = ((rows >= 0) & (rows < s))[:, :, None] & ((cols >= 0) & (cols < s))[:, None, :]
    return torch.where(inside[..., None], out, torch.full_like(out, PAD_VALUE))


def photometric(x: torch.Tensor, p: float, gen: torch.Generator) -> torch.Tensor:
    """x: [B, 3, S, S] float32 in 0..255 -> the same, with brightness/contrast, blur and noise applied to
    each page view with probability p."""
    b, dev = x.shape[0], x.device

    def coin() -> torch.Tensor:                                                   # [B, 1, 1, 1] 0/1
        return (torch.rand(b, 1, 1, 1, generator=gen, device=dev) < p).float()

    def uniform(lo: float, hi: float) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(b, 1, 1, 1, generator=gen, device=dev)

    on = coin()
    contrast = 1 + on * uniform(-0.3, 0.15)
    bright = on * uniform(-40.0, 20.0)
    x = (x - 128.0) * contrast + 128.0 + bright
    sigma = coin() * uniform(0.3, MAX_SIGMA)                                      # 0 = no blur
    t = torch.arange(BLUR_TAPS, device=dev, dtype=x.dtype) - BLUR_TAPS // 2
    k = torch.exp(-t ** 2 / (2 * sigma.view(b, 1).clamp(min=1e-3) ** 2))
    k = torch.where(sigma.view(b, 1) > 0, k, (t == 0).to(x.dtype).expand(b, -1))
    k = (k / k.sum(1, keepdim=True)).repeat_interleave(3, dim=0)                  # [B*3, taps]
    s = x.shape[-1]
    h = BLUR_TAPS // 2
    y = F.pad(x.reshape(1, b * 3, s, s), (h, h, h, h), mode="replicate")        # [1, B*3, S+2h, S+2h]
    y = F.conv2d(y, k[:, None, None, :], groups=b * 3)                          # along rows
    y = F.conv2d(y, k[:, None, :, None], groups=b * 3)                          # along columns
    x = y.reshape(b, 3, s, s)
    noise = coin() * uniform(2.0, MAX_NOISE)
    return x + noise * torch.randn(x.shape, generator=gen, device=dev)


def to_pixels(canvases: torch.Tensor, shifts: torch.Tensor, p: float, gen: torch.Generator | None) -> torch.Tensor:
    """canvases: [B, S, S, 3] uint8 (pool), shifts: [B, 2] -> pixels: [B, 3, S, S] float32 normalized as
    the runtime does.  p = 0 or gen None: only the shift (the unshifted placement is the page itself)."""
    x = shift(canvases, shifts).permute(0, 3, 1, 2)                               # [B, 3, S, S] uint8
    if p > 0 and gen is not None:
        x = photometric(x.float(), p, gen).round().clamp(0, 255).to(torch.uint8)
    lut = torch.from_numpy(np.ascontiguousarray(_LUT)).to(x.device)               # [3, 256]
    ch = torch.arange(3, device=x.device)[None, :, None, None]
    return lut[ch, x.long()]                                                      # [B, 3, S, S] float32
