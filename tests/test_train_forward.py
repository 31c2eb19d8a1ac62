"""The trainer's batched forward equals transformers' HunYuanVLForConditionalGeneration forward."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _patches(pixels):
    """[B, 3, S, S] -> transformers' flat patches [B*g*g, 3*16*16] (raster order, channel-major)."""
    b, c, s, _ = pixels.shape
    g = s // 16
    return pixels.reshape(b, c, g, 16, g, 16).permute(0, 2, 4, 1, 3, 5).reshape(b * g * g, c * 256)


def test_batched_forward_equals_transformers(ckpt_a):
    from tokenizers import Tokenizer
    from transformers import HunYuanVLForConditionalGeneration

    from edgeocr import prompts
    from quantize.tokenizer_build import special_ids
    from quantize.train.forward import IGNORE, BatchedHunYuanVL

    hf = HunYuanVLForConditionalGeneration.from_pretrained(str(ckpt_a), dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    tok = Tokenizer.from_file(str(ckpt_a / "tokenizer.json"))
    ids = special_ids(tok)
    canvas = 256                                    # grid 16 of the 16x16 position table: resized, as transformers
    n_img = (canvas // 32) * (canvas // 32 + 1) + 2
    pt = prompts.PromptTokens(bos=ids["bos_token_id"], system_sep=ids["system_sep_token_id"],
                              im_start=ids["im_start_id"], im_end=ids["im_end_id"], image=ids["image_token_id"],
                              user=ids["user_token_id"])
    g = torch.Generator().manual_seed(0)
    rows, labels = [], []
    for task, n_answer in (("structured_parse", 9), ("spotting", 3), ("structured_parse", 14)):
        p = prompts.build_prompt_ids(pt, n_img, tok.encode(prompts.task_prompt(task)).ids)
        a = torch.randint(10, 300, (n_answer,), generator=g).tolist()
        rows.append(p + a)
        labels.append([IGNORE] * len(p) + a)
    assert len({len(r) for r in rows}) == 3         # different prompt and answer lengths: padding is exercised
    L = max(map(len, rows))
    pad = ids["pad_token_id"]
    input_ids = torch.tensor([r + [pad] * (L - len(r)) for r in rows])
    lab = torch.tensor([r + [IGNORE] * (L - len(r)) for r in labels])
    mask = torch.tensor([[1] * len(r) + [0] * (L - len(r)) for r in rows])
    pixels = torch.randn(3, 3, canvas, canvas, generator=g)

    # transformers, batched, with each row's positions as transformers builds them for that row alone (one
    # image per sequence: image ordinal 0, what the runtime feeds)
    mm = (input_ids == ids["image_token_id"]).int()
    grid = torch.tensor([[1, canvas // 16, canvas // 16]])
    pos = torch.cat([hf.model.get_rope_index(input_ids[k:k + 1], mm[k:k + 1], grid, mask[k:k + 1])[0]
                     for k in range(3)], dim=1)                              # [4, B, L]
    with torch.no_grad():
        ref = hf(input_ids=input_ids, attention_mask=mask, labels=lab, pixel_values=_patches(pixels),
                 image_grid_thw=grid.repeat(3, 1), mm_token_type_ids=mm, position_ids=pos)
        fwd = BatchedHunYuanVL(hf, image_start=rows[0].index(ids["image_token_id"]), canvas=canvas)
        assert torch.equal(fwd.position_ids(3, L, "cpu") * mask, pos)     # transformers puts 0 on padding
        out = fwd(input_ids, lab, pixels)
        first = min(lab[k].ne(IGNORE).nonzero()[0, 0].item() for k in range(3)) - 1
        cut = fwd(input_ids, lab, pixels, first=first)

    for k, r in enumerate(rows):                    # logits of every real token (padding is not compared)
        torch.testing.assert_close(out.logits[k, :len(r)], ref.logits[k, :len(r)], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(cut.logits[k, :len(r) - first], ref.logits[k, first:len(r)], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, ref.loss, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(cut.loss, ref.loss, atol=1e-5, rtol=1e-6)
    assert ref.loss > 1.0                           # random weights: a real loss, not a degenerate one
