"""A batched training forward of transformers' HunYuanVLForConditionalGeneration, on its own modules.

Every page of a batch is a 1024x1024 canvas, so the batch goes through the vision encoder as one tensor
(`[B, 4096, C]`, bidirectional sdpa per image), through the patch merger as one tensor, and into the token
embeddings at the image slots by index; the decoder runs with its XD-RoPE positions built on the device
for the whole batch (spec §4.2: the grid tokens get column, row and image ordinal 0 — one image per
sequence, as the runtime feeds it) and causal sdpa.  No per-image Python loop, no host sync.

The parameters are the wrapped model's own (`self.hf`), so `save_pretrained` of that model writes the
checkpoint in transformers' format.  Numerically this equals transformers' forward on the same inputs
(tests/test_train_forward.py); it differs in what it skips: attention masks for padding (sequences are
right-padded and attention is causal, so a real token never sees padding; logits at padding positions
are not meaningful), and logits before `first` (the prompt, which carries no loss).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.hunyuan_vl.modeling_hunyuan_vl import apply_rotary_pos_emb

IGNORE = -100                  # label of tokens without loss


@dataclass(frozen=True)
class Geometry:
    """Where the image sits in every sequence of a batch (all pages share the canvas and prompt layout)."""

    grid: int                  # ViT patches per side (canvas / patch)
    merge: int                 # spatial merge (2)
    image_start: int           # index of the first image slot (the begin token)

    @property
    def merged(self) -> int:   # merged tokens per side
        return self.grid // self.merge

    @property
    def image_tokens(self) -> int:   # slots: begin + rows x (columns + newline) + end
        return self.merged * (self.merged + 1) + 2


@dataclass
class Output:
    loss: torch.Tensor          # [] float32: mean cross-entropy over the answer tokens of the batch
    logits: torch.Tensor        # [B, L - first, V]: logits of positions first..L-1
    image_embeds: torch.Tensor  # [B, image_tokens, H]: the merger's output (the glyph loss reads it)


class BatchedHunYuanVL(nn.Module):
    """Training forward over `hf` (a HunYuanVLForConditionalGeneration); holds no parameters of its own."""

    def __init__(self, hf: nn.Module, image_start: int, canvas: int = 1024):
        super().__init__()
        self.hf = hf
        vc = hf.config.vision_config
        self.geo = Geometry(grid=canvas // vc.patch_size, merge=vc.spatial_merge_size, image_start=image_start)
        self.n_axes = len(hf.config.text_config.rope_parameters["mrope_section"])

    # -- vision ------------------------------------------------------------------------------------------
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels: [B, 3, S, S] normalized -> merged image embeddings [B, image_tokens, H]."""
        vt = self.hf.model.vision_tower
        emb = vt.embeddings
        g = self.geo.grid
        w = emb.patch_embedding.weight
        x = emb.patch_embedding(pixels.to(w.dtype))                        # [B, C, g, g]
        x = x.flatten(2).transpose(1, 2)                                   # [B, g*g, C]
        x = x + emb.interpolate_pos_encoding(x, g, g)                      # + [1, g*g, C]
        for blk in vt.layers:
            x = x + self._vision_attention(blk.self_attn, blk.layer_norm1(x))
            x = x + blk.mlp(blk.layer_norm2(x))
        return vt.patch_merger(x, size=(g, g))                             # [B, image_tokens, H]

    @staticmethod
    def _vision_attention(att: nn.Module, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (p(x).view(b, n, att.num_heads, att.head_dim).transpose(1, 2)
                   for p in (att.q_proj, att.k_proj, att.v_proj))          # [B, heads, N, D]
        o = F.scaled_dot_product_attention(q, k, v, scale=att.scaling)    # one image per row: no mask
        return att.o_proj(o.transpose(1, 2).reshape(b, n, -1))

    # -- positions ---------------------------------------------------------------------------------------
    def position_ids(self, batch: int, length: int, device) -> torch.Tensor:
        """[n_axes, B, L] int64: sequence index on every axis; the grid tokens get (column, row, 0) on the
        last three axes (spec §4.2)."""
        pos = torch.arange(length, device=device).expand(self.n_axes, batch, length).clone()
        m = self.geo.merged
        a = self.geo.image_start + 1
        b = a + m * (m + 1)
        cell = torch.arange(m * (m + 1), device=device)
        off = self.n_axes - 3
        pos[off, :, a:b] = cell % (m + 1)                                 # column (newline column = m)
        pos[off + 1, :, a:b] = cell // (m + 1)                            # row
        pos[off + 2, :, a:b] = 0                                          # image ordinal: one image
        return pos

    # -- decoder -----------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, pixels: torch.Tensor,
                first: int = 0) -> Output:
        """input_ids, labels: [B, L] int64 (right-padded; labels IGNORE outside the answers);
        pixels: [B, 3, S, S] normalized; `first`: the first position whose logits are needed (at most the
        shortest prompt's length - 1)."""
        lm = self.hf.model.language_model
        bsz, length = input_ids.shape
        image = self.encode_images(pixels)                                 # [B, T_img, H]
        x = lm.embed_tokens(input_ids)                                     # [B, L, H]
        s = self.geo.image_start
        x = torch.cat([x[:, :s], image.to(x.dtype), x[:, s + image.shape[1]:]], dim=1)   # image slots by index
        pos = self.position_ids(bsz, length, input_ids.device)             # [n_axes, B, L]
        cos, sin = lm.rotary_emb(x, pos)                                   # [B, L, D] each
        for layer in lm.layers:
            x = x + self._decoder_attention(layer.self_attn, layer.input_layernorm(x), cos, sin)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        h = lm.norm(x[:, first:])                                          # [B, L - first, H]
        logits = self.hf.lm_head(h)                                        # [B, L - first, V]
        target = labels[:, first + 1:]                                     # next-token targets
        loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), target.reshape(-1),
                               ignore_index=IGNORE)
        return Output(loss=loss, logits=logits, image_embeds=image)

    @staticmethod
    def _decoder_attention(att: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        d = att.head_dim
        q = att.q_proj(x).view(b, n, -1, d).transpose(1, 2)               # [B, heads, L, D]
        k = att.k_proj(x).view(b, n, -1, d).transpose(1, 2)               # [B, kv_heads, L, D]
        v = att.v_proj(x).view(b, n, -1, d).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)                        # XD-RoPE in fp32, as transformers
        q, k = att.query_layernorm(q), att.key_layernorm(k)                # QK-norm after RoPE
        rep = att.num_key_value_groups                                     # query head h reads KV head h // rep
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=att.scaling)
        return att.o_proj(o.transpose(1, 2).reshape(b, n, -1))
