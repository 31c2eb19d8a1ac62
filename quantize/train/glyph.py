"""The encoder's auxiliary glyph loss (`--glyph-loss W`).

A linear head on each merged image token's embedding names the characters inside its 32x32 cell, slot by
slot in reading order (SLOTS softmax classifiers over the generator's charset + 'other' + 'none').
Cross-entropy summed over the slots, averaged over the tokens.  It teaches the encoder glyphs, and their
order inside a token, directly instead of only through the decoder.  Training only: the head is kept in
the resumable state and beside the checkpoint's weights (GLYPH_HEAD, bf16, read by the next stage's --init;
transformers ignores it), never in the model.

Targets are built on the device from the pool's character positions, after the view's shift: a
character's cell is where its (shifted) centre falls; its slot is its rank among the characters of that
cell in reading order (a stable sort); characters past SLOTS in one cell are left out.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from quantize.checkpoint import GLYPH_HEAD  # beside a checkpoint's model.safetensors

CELL = 32                      # canvas pixels per merged image token (patch 16 x merge 2)
SLOTS = 6                      # characters per token the loss names, in reading order


def glyph_targets(chars: torch.Tensor, shifts: torch.Tensor, grid: int, n_cls: int) -> torch.Tensor:
    """chars: [B, C, 3] int16 (x, y, class; class -1 = none), shifts: [B, 2] (dx, dy) ->
    [B, grid*grid, SLOTS] int64 classes (n_cls - 1 = 'none')."""
    b, c, _ = chars.shape
    dev = chars.device
    x = chars[..., 0].long() + shifts[:, 0:1].long()
    y = chars[..., 1].long() + shifts[:, 1:2].long()
    col, row = torch.div(x, CELL, rounding_mode="floor"), torch.div(y, CELL, rounding_mode="floor")
    valid = (chars[..., 2] >= 0) & (col >= 0) & (col < grid) & (row >= 0) & (row < grid)
    cells = grid * grid
    key = torch.where(valid, torch.arange(b, device=dev)[:, None] * cells + row * grid + col,
                      torch.full_like(col, b * cells))                            # [B, C]; invalid sort last
    flat, order = torch.sort(key.reshape(-1), stable=True)                        # reading order kept per cell
    idx = torch.arange(flat.numel(), device=dev)
    start = torch.ones_like(flat, dtype=torch.bool)
    start[1:] = flat[1:] != flat[:-1]
    first = torch.cummax(torch.where(start, idx, torch.zeros_like(idx)), 0).values
    slot = idx - first                                                            # rank inside the cell
    cls = chars[..., 2].long().reshape(-1)[order]
    keep = (flat < b * cells) & (slot < SLOTS)
    target = torch.full((b * cells * SLOTS + 1,), n_cls - 1, dtype=torch.long, device=dev)
    dest = torch.where(keep, flat * SLOTS + slot, torch.full_like(flat, b * cells * SLOTS))   # dump slot
    target.scatter_(0, dest, torch.where(keep, cls, torch.full_like(cls, n_cls - 1)))
    return target[:-1].reshape(b, cells, SLOTS)


class GlyphHead(nn.Module):
    def __init__(self, hidden: int, charset: int, grid: int):
        super().__init__()
        self.n_cls = charset + 2                                                  # charset, other, none
        self.grid = grid
        self.proj = nn.Linear(hidden, SLOTS * self.n_cls)
        r = torch.arange(grid)
        # the merger's tokens: begin, grid x (grid cells + newline), end -> the cells' rows
        self.register_buffer("cells", (1 + r[:, None] * (grid + 1) + r[None, :]).reshape(-1), persistent=False)

    def forward(self, image_embeds: torch.Tensor, chars: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
        """image_embeds: [B, image_tokens, H]; chars: [B, C, 3]; shifts: [B, 2] -> loss [] float32."""
        b = image_embeds.shape[0]
        v = image_embeds[:, self.cells]                                           # [B, grid^2, H]
        logits = self.proj(v).float().reshape(-1, self.n_cls)                     # [B*grid^2*SLOTS, n_cls]
        target = glyph_targets(chars, shifts, self.grid, self.n_cls).reshape(-1)
        return F.cross_entropy(logits, target, reduction="sum") / (b * self.grid * self.grid)


def save_glyph_head(head: GlyphHead, checkpoint: "Path") -> None:
    torch.save({k: v.detach().to("cpu", torch.bfloat16) for k, v in head.state_dict().items()},
               Path(checkpoint) / GLYPH_HEAD)


def load_glyph_head(head: GlyphHead, checkpoint: "Path") -> bool:
    """The head saved beside `checkpoint`, if there is one of this head's shape; True when loaded."""
    f = Path(checkpoint) / GLYPH_HEAD
    if not f.exists():
        return False
    st = torch.load(f, map_location="cpu", weights_only=True)
    mine = head.state_dict()
    if set(st) != set(mine) or any(st[k].shape != mine[k].shape for k in mine):
        return False                    # another charset or width: start a fresh head
    head.load_state_dict({k: v.to(mine[k].dtype) for k, v in st.items()})
    return True
