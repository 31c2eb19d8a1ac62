"""Training batches drawn from the page pool, assembled on the device.

A step draws, from a generator seeded by (seed, step) — so a resumed run draws what an uninterrupted one
would — B (page, task, placement) triples: the task alternates between full text and spotting at random,
the placement is one of the page's 1 + shifts pre-tokenized shifts.  The host only draws these indices
and reads the targets' lengths (kept on the host) to size the batch; the sequences
`prompt(task) + target` are gathered and padded on the device, prompts built once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from edgeocr import prompts
from quantize.train.forward import IGNORE
from quantize.train.pages import TASKS
from quantize.train.pool import PagePool

ROUND = 64                     # batch lengths are rounded up to this (few distinct shapes for torch.compile)


@dataclass
class Batch:
    input_ids: torch.Tensor     # [B, L] int64, right-padded
    labels: torch.Tensor        # [B, L] int64, IGNORE outside the answers
    canvases: torch.Tensor      # [B, S, S, 3] uint8
    shifts: torch.Tensor        # [B, 2] int32 (dx, dy) the page is drawn at
    chars: torch.Tensor         # [B, C, 3] int16 the page's characters (glyph loss)


class Prompts:
    """The prompt of every task as token ids, on the device."""

    def __init__(self, tok, ids: dict, n_image_tokens: int, device):
        pt = prompts.PromptTokens(bos=ids["bos_token_id"], system_sep=ids["system_sep_token_id"],
                                  im_start=ids["im_start_id"], im_end=ids["im_end_id"],
                                  image=ids["image_token_id"], user=ids["user_token_id"])
        rows = [prompts.build_prompt_ids(pt, n_image_tokens, tok.encode(prompts.task_prompt(t)).ids) for t in TASKS]
        self.lengths = np.asarray([len(r) for r in rows])                  # [tasks] on the host
        width = int(self.lengths.max())
        self.ids = torch.tensor([r + [ids["pad_token_id"]] * (width - len(r)) for r in rows], device=device)
        self.image_start = rows[0].index(ids["image_token_id"])
        if any(r.index(ids["image_token_id"]) != self.image_start for r in rows):
            raise ValueError("the task prompts place the image differently")
        self.pad = ids["pad_token_id"]

    @property
    def first_answer(self) -> int:
        """The earliest answer position of any task (logits are needed from here - 1 on)."""
        return int(self.lengths.min())


class Sampler:
    def __init__(self, pool: PagePool, prompts_: Prompts, batch: int, seed: int):
        self.pool, self.prompts, self.batch, self.seed = pool, prompts_, batch, seed
        self.variants = pool.shifts.shape[1]

    def draw(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(page, task, placement) indices of step `step`, each [B] int64 on the host."""
        rng = np.random.default_rng([self.seed, step, 5])
        page = rng.integers(0, len(self.pool), self.batch)
        task = rng.integers(0, len(TASKS), self.batch)
        place = rng.integers(0, self.variants, self.batch)
        return page, task, place

    def __call__(self, step: int, upload) -> Batch:
        """The batch of step `step`; `upload` moves a list of [B] int64 host arrays to the device."""
        page, task, place = self.draw(step)
        row = np.where(task == 0, 0, 1 + place)                            # target row in the pool
        plen = self.prompts.lengths[task]                                  # [B]
        tlen = self.pool.lengths[page, row]                                # [B]
        length = int(-(-(plen + tlen).max() // ROUND) * ROUND)
        dev = self.pool.canvases.device
        page_t, task_t, row_t, place_t, plen_t, tlen_t = upload([page, task, row, place, plen, tlen])
        plen_t, tlen_t = plen_t[:, None], tlen_t[:, None]                          # [B, 1]
        j = torch.arange(length, device=dev)[None, :]                               # [1, L]
        in_prompt = j < plen_t
        in_target = ~in_prompt & (j < plen_t + tlen_t)
        width_p, width_t = self.prompts.ids.shape[1], self.pool.targets.shape[2]
        p_tok = self.prompts.ids[task_t[:, None], j.clamp(max=width_p - 1)]        # [B, L]
        t_tok = self.pool.targets[page_t[:, None], row_t[:, None],
                                  (j - plen_t).clamp(0, width_t - 1)].long()       # [B, L]
        pad = torch.full_like(p_tok, self.prompts.pad)
        input_ids = torch.where(in_prompt, p_tok, torch.where(in_target, t_tok, pad))
        labels = torch.where(in_target, t_tok, torch.full_like(t_tok, IGNORE))
        return Batch(input_ids=input_ids, labels=labels, canvases=self.pool.canvases[page_t],
                     shifts=self.pool.shifts[page_t, place_t], chars=self.pool.chars[page_t])
