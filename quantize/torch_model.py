"""Export-friendly torch modules for HunyuanVL, built from the checkpoint's own tensors.

These mirror transformers' `hunyuan_vl` numerics (spec §3) but are shaped for fixed-shape ONNX:
- `VisionEncoder`: [1, 3, S, S] normalized pixels -> [N_img, H] image embeddings (begin/newline/end
  included), position table resized once for the fixed grid and stored as a constant.
- `Decoder`: one graph for prefill (S tokens) and decode (S = 1) over a static KV cache.  Past keys
  and values come in as read-only per-layer inputs [1, KVH, MAX, D]; only the new rows go out
  ([1, KVH, S, D]); the runtime writes them into its preallocated buffers.  Attention combines
  scores over the past (masked by `past_len`) with causal scores over the new tokens, so no cache
  is concatenated or copied inside the graph.  XD-RoPE cos/sin come from the host.
Norm statistics, softmax and RoPE run in float32 whatever the weight dtype.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from quantize.checkpoint import ModelSpec

NEG_INF = -1.0e9   # additive mask value; scores are float32


class MultiHeadAttention(torch.autograd.Function):
    """ONNX Runtime's com.microsoft MultiHeadAttention (fused flash / memory-efficient attention on CUDA)
    for the vision encoder's full attention: q, k, v [1, N, C] -> [1, N, C].  The eager forward is the
    same computation in torch (tracing, tests)."""

    @staticmethod
    def forward(ctx, q, k, v, num_heads: int):
        if torch.jit.is_tracing():
            return torch.zeros_like(q)
        b, n, c = q.shape
        d = c // num_heads
        qh, kh, vh = (t.reshape(b, n, num_heads, d).transpose(1, 2) for t in (q, k, v))
        s = torch.matmul(qh, kh.transpose(-1, -2)).float() * (d ** -0.5)
        return torch.matmul(torch.softmax(s, dim=-1).to(q.dtype), vh).transpose(1, 2).reshape(b, n, c)

    @staticmethod
    def symbolic(g, q, k, v, num_heads):
        out = g.op("com.microsoft::MultiHeadAttention", q, k, v, num_heads_i=num_heads)
        out.setType(q.type())
        return out


class GroupQueryAttention(torch.autograd.Function):
    """ONNX Runtime's com.microsoft GroupQueryAttention over a static, shared KV buffer (attention="gqa").

    Exported as one node per layer: it writes this step's K/V rows into the cache in place (the runtime
    binds each layer's past and present outputs to the same buffer) and attends over the live length
    only (`seqlens_k` = total length - 1), so a decode step neither copies nor reads the unused cache.
    The eager forward is the same computation in torch, used for tracing and for tests.
    q: [B, S, H*D] (RoPE and QK-norm applied); k, v: [B, S, KVH*D]; caches [B, KVH, MAX, D]; seqlens_k [B].
    """

    @staticmethod
    def forward(ctx, q, k, v, past_k, past_v, seqlens_k, total_len, num_heads: int, kv_heads: int):
        if torch.jit.is_tracing():          # exported through symbolic(); only the shapes matter here
            return torch.zeros_like(q), past_k.clone(), past_v.clone()
        b, s, d = q.shape[0], q.shape[1], past_k.shape[-1]
        g = num_heads // kv_heads
        pk, pv = past_k.clone(), past_v.clone()
        outs = []
        for i in range(b):                  # each sequence at its own length (seqlens_k[i] = total_i - 1)
            total = int(seqlens_k.reshape(-1)[i]) + 1
            start = total - s
            pk[i, :, start:total] = k[i].reshape(s, kv_heads, d).transpose(0, 1)
            pv[i, :, start:total] = v[i].reshape(s, kv_heads, d).transpose(0, 1)
            qh = q[i:i + 1].reshape(1, s, kv_heads, g, d).permute(0, 2, 3, 1, 4)           # [1, KVH, G, S, D]
            kk, vv = pk[i:i + 1, :, :total].unsqueeze(2), pv[i:i + 1, :, :total].unsqueeze(2)
            sc = torch.matmul(qh, kk.transpose(-1, -2)).float() / math.sqrt(d)             # [1, KVH, G, S, T]
            rows = torch.arange(s, device=q.device).reshape(s, 1) + start
            cols = torch.arange(total, device=q.device).reshape(1, total)
            sc = sc + torch.where(cols <= rows, 0.0, NEG_INF)
            o = torch.matmul(torch.softmax(sc, dim=-1).to(q.dtype), vv)
            outs.append(o.permute(0, 3, 1, 2, 4).reshape(1, s, num_heads * d))
        return torch.cat(outs), pk, pv

    @staticmethod
    def symbolic(g, q, k, v, past_k, past_v, seqlens_k, total_len, num_heads, kv_heads):
        o, pk, pv = g.op("com.microsoft::GroupQueryAttention", q, k, v, past_k, past_v, seqlens_k, total_len,
                         num_heads_i=num_heads, kv_num_heads_i=kv_heads, outputs=3)
        o.setType(q.type())
        pk.setType(past_k.type())
        pv.setType(past_v.type())
        return o, pk, pv


def _p(a: np.ndarray, dtype) -> nn.Parameter:
    return nn.Parameter(torch.from_numpy(np.ascontiguousarray(a)).to(dtype), requires_grad=False)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    dt = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(dt)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(), eps).to(x.dtype)


def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="none")


def resized_position_table(pos_weight: np.ndarray, edge: int, gh: int, gw: int) -> np.ndarray:
    """transformers >= 5.13: bilinear, align_corners=False, size=(gh, gw) over rows 1.. of the table."""
    c = pos_weight.shape[1]
    grid = torch.from_numpy(pos_weight[1:]).float().reshape(1, edge, edge, c).permute(0, 3, 1, 2)
    out = F.interpolate(grid, size=(gh, gw), mode="bilinear", align_corners=False)
    return out.permute(0, 2, 3, 1).reshape(gh * gw, c).numpy()


class VisionEncoder(nn.Module):
    def __init__(self, spec: ModelSpec, w: dict[str, np.ndarray], image_size: int, dtype=torch.float32,
                 fused_attention: bool = False):
        super().__init__()
        v = spec.vision
        self.fused = fused_attention
        self.v, self.eps = v, v.eps
        self.grid = image_size // v.patch_size                     # 64 for 1024 / 16
        if self.grid * v.patch_size != image_size or self.grid % v.spatial_merge_size:
            raise ValueError(f"image size {image_size} is not a multiple of patch*merge")
        self.heads, self.hd = v.num_heads, v.hidden_size // v.num_heads
        self.patch_w = _p(w["vit.embeddings.patch_embedding.weight"], dtype)
        self.patch_b = _p(w["vit.embeddings.patch_embedding.bias"], dtype)
        edge = v.max_image_size // v.patch_size
        self.pos = _p(resized_position_table(w["vit.embeddings.position_embedding.weight"], edge,
                                             self.grid, self.grid), dtype)     # [grid*grid, C]
        self.layers = nn.ModuleList()
        for j in range(v.num_layers):
            p = f"vit.layers.{j}."
            m = nn.Module()
            for name in ("input_layernorm", "post_attention_layernorm"):
                setattr(m, name + "_w", _p(w[p + name + ".weight"], dtype))
                setattr(m, name + "_b", _p(w[p + name + ".bias"], dtype))
            qkv = np.concatenate([w[p + f"self_attn.{n}.weight"] for n in ("q_proj", "k_proj", "v_proj")])
            qkv_b = np.concatenate([w[p + f"self_attn.{n}.bias"] for n in ("q_proj", "k_proj", "v_proj")])
            m.qkv_w, m.qkv_b = _p(qkv, dtype), _p(qkv_b, dtype)
            m.o_w, m.o_b = _p(w[p + "self_attn.o_proj.weight"], dtype), _p(w[p + "self_attn.o_proj.bias"], dtype)
            m.fc1_w, m.fc1_b = _p(w[p + "mlp.dense_h_to_4h.weight"], dtype), _p(w[p + "mlp.dense_h_to_4h.bias"], dtype)
            m.fc2_w, m.fc2_b = _p(w[p + "mlp.dense_4h_to_h.weight"], dtype), _p(w[p + "mlp.dense_4h_to_h.bias"], dtype)
            self.layers.append(m)
        q = "vit.perceive."
        self.before_rms = _p(w[q + "before_rms.weight"], dtype)
        self.conv0_w, self.conv0_b = _p(w[q + "proj.0.weight"], dtype), _p(w[q + "proj.0.bias"], dtype)
        self.conv2_w, self.conv2_b = _p(w[q + "proj.2.weight"], dtype), _p(w[q + "proj.2.bias"], dtype)
        self.mlp_w, self.mlp_b = _p(w[q + "mlp.weight"], dtype), _p(w[q + "mlp.bias"], dtype)
        self.newline = _p(w[q + "image_newline"], dtype)
        self.begin, self.end = _p(w[q + "image_begin"], dtype), _p(w[q + "image_end"], dtype)
        self.after_rms = _p(w[q + "after_rms.weight"], dtype)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        # pixels: [1, 3, S, S] float32, normalized -> image_embeds: [N_img, H]
        dt = self.patch_w.dtype
        x = F.conv2d(pixels.to(dt), self.patch_w, self.patch_b, stride=self.v.patch_size)  # [1, C, g, g]
        c = x.shape[1]
        n = self.grid * self.grid
        x = x.reshape(1, c, n).transpose(1, 2) + self.pos                               # [1, N, C] raster
        for m in self.layers:
            h = layer_norm(x, m.input_layernorm_w, m.input_layernorm_b, self.eps)
            if self.fused:
                q, k, v = F.linear(h, m.qkv_w, m.qkv_b).split(c, dim=-1)                    # [1, N, C] each
                o = MultiHeadAttention.apply(q, k, v, self.heads)
            else:
                qkv = F.linear(h, m.qkv_w, m.qkv_b).reshape(1, n, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
                q, k, v = qkv[0], qkv[1], qkv[2]                                          # [1, h, N, hd]
                s = torch.matmul(q, k.transpose(-1, -2)).float() * (self.hd ** -0.5)
                a = torch.softmax(s, dim=-1).to(dt)
                o = torch.matmul(a, v).transpose(1, 2).reshape(1, n, c)
            x = x + F.linear(o, m.o_w, m.o_b)
            h = layer_norm(x, m.post_attention_layernorm_w, m.post_attention_layernorm_b, self.eps)
            x = x + F.linear(gelu_erf(F.linear(h, m.fc1_w, m.fc1_b)), m.fc2_w, m.fc2_b)
        # patch merger ("perceive")
        x = rms_norm(x, self.before_rms, self.eps)
        x = x.transpose(1, 2).reshape(1, c, self.grid, self.grid)
        x = F.conv2d(x, self.conv0_w, self.conv0_b, stride=self.v.spatial_merge_size)
        x = F.conv2d(gelu_erf(x), self.conv2_w, self.conv2_b)                             # [1, 4C, g/2, g/2]
        g2 = self.grid // self.v.spatial_merge_size
        nl = self.newline.reshape(1, 4 * c, 1, 1).expand(1, 4 * c, g2, 1)
        x = torch.cat([x, nl], dim=-1).reshape(1, 4 * c, g2 * (g2 + 1)).transpose(1, 2)  # [1, R, 4C]
        x = F.linear(x, self.mlp_w, self.mlp_b)[0]                                        # [R, H]
        x = torch.cat([self.begin[None], x, self.end[None]], dim=0)                       # [R + 2, H]
        return rms_norm(x, self.after_rms, self.eps)


class Decoder(nn.Module):
    def __init__(self, spec: ModelSpec, w: dict[str, np.ndarray], cache_len: int, dtype=torch.float32,
                 attention: str = "masked"):
        super().__init__()
        t = spec.text
        if attention not in ("masked", "gqa"):
            raise ValueError(f"attention must be 'masked' or 'gqa', not {attention!r}")
        self.t, self.cache_len, self.attention = t, cache_len, attention
        self.g = t.num_heads // t.num_kv_heads
        self.image_token = spec.tokens.image
        self.embed = _p(w["model.embed_tokens.weight"], dtype)
        tied = t.tie_word_embeddings and np.shares_memory(w["lm_head.weight"], w["model.embed_tokens.weight"])
        self.lm_head = self.embed if tied else _p(w["lm_head.weight"], dtype)
        self.norm = _p(w["model.norm.weight"], dtype)
        self.layers = nn.ModuleList()
        for i in range(t.num_layers):
            p = f"model.layers.{i}."
            m = nn.Module()
            m.ln1, m.ln2 = _p(w[p + "input_layernorm.weight"], dtype), _p(w[p + "post_attention_layernorm.weight"], dtype)
            q, k, v, m.o = (w[p + f"self_attn.{n}_proj.weight"] for n in "qkvo")
            m.o = _p(m.o, dtype)
            m.qn, m.kn = _p(w[p + "self_attn.query_layernorm.weight"], dtype), _p(w[p + "self_attn.key_layernorm.weight"], dtype)
            gate, up, down = (w[p + f"mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
            m.down = _p(down, dtype)
            if attention == "gqa":          # fused projections: one GEMV for q|k|v and one for gate|up
                m.qkv, m.gate_up = _p(np.concatenate([q, k, v]), dtype), _p(np.concatenate([gate, up]), dtype)
            else:
                m.q, m.k, m.v, m.gate, m.up = (_p(a, dtype) for a in (q, k, v, gate, up))
            self.layers.append(m)
        if attention == "gqa":
            # rotate_half(x) = x @ R: one small MatMul instead of slice/negate/concat (exact: one +-1 a column)
            d, half = t.head_dim, t.head_dim // 2
            rot = torch.zeros(d, d, dtype=dtype)
            rot[torch.arange(half) + half, torch.arange(half)] = -1
            rot[torch.arange(half), torch.arange(half) + half] = 1
            self.register_buffer("rope_rotate_half", rot)

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        half = xf.shape[-1] // 2
        rot = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
        return (xf * cos + rot * sin).to(x.dtype)

    def _embed(self, input_ids, image_embeds):
        text = F.embedding(input_ids, self.embed)                                         # [B, S, H]
        is_img = input_ids == self.image_token
        idx = torch.clamp(torch.cumsum(is_img.to(torch.int64), dim=1) - 1, min=0)
        last_row = torch.ones_like(image_embeds[:, 0], dtype=torch.int64).sum() - 1          # N - 1, traced
        idx = torch.minimum(idx, last_row)
        img = F.embedding(idx, image_embeds.to(self.embed.dtype))
        return torch.where(is_img.unsqueeze(-1), img, text)

    def _mlp(self, m, x):
        """Post-attention norm + SwiGLU MLP, residual added."""
        h = rms_norm(x, m.ln2, self.t.rms_norm_eps)
        return x + F.linear(F.silu(F.linear(h, m.gate)) * F.linear(h, m.up), m.down)

    def _logits(self, x):
        last = rms_norm(x[:, -1, :], self.norm, self.t.rms_norm_eps)                      # [B, H]
        # W [V, H] @ last^T [H, B]: uses the (tied) weight as stored, so the exporter does not fold a
        # transposed copy of the embedding into the graph
        logits = torch.matmul(self.lm_head, last.transpose(0, 1)).transpose(0, 1)         # [B, V]
        return logits.float() if logits.dtype != torch.float32 else logits   # no no-op output Cast (NNCF)

    def _forward_gqa(self, input_ids, image_embeds, cos, sin, seqlens_k, total_len, *past):
        """Few kernels per layer (a decode step is bound by their count, not by bytes): fused q|k|v and
        gate|up projections, RoPE on q and k together in the compute dtype via `rope_rotate_half`, the
        attention and cache update in one GroupQueryAttention node."""
        t = self.t
        L, b, s = t.num_layers, input_ids.shape[0], input_ids.shape[1]
        nq, kvh, d = t.num_heads, t.num_kv_heads, t.head_dim
        dt = self.embed.dtype
        x = self._embed(input_ids, image_embeds)
        cos_q, sin_q = cos.reshape(b, s, 1, d).to(dt), sin.reshape(b, s, 1, d).to(dt)
        keys, values = [], []
        for i, m in enumerate(self.layers):
            h = rms_norm(x, m.ln1, t.rms_norm_eps)
            qk, v = F.linear(h, m.qkv).split([(nq + kvh) * d, kvh * d], dim=-1)
            qk = qk.reshape(b, s, nq + kvh, d)
            qk = qk * cos_q + torch.matmul(qk, self.rope_rotate_half) * sin_q                 # RoPE, then QK-norm
            q, k = qk.split([nq, kvh], dim=2)
            q = rms_norm(q, m.qn, t.rms_norm_eps).reshape(b, s, nq * d)
            k = rms_norm(k, m.kn, t.rms_norm_eps).reshape(b, s, kvh * d)
            o, pk, pv = GroupQueryAttention.apply(q, k, v, past[i], past[L + i], seqlens_k, total_len, nq, kvh)
            keys.append(pk)
            values.append(pv)
            x = x + F.linear(o, m.o)
            gate, up = F.linear(rms_norm(x, m.ln2, t.rms_norm_eps), m.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, m.down)
        return (self._logits(x), *keys, *values)

    def forward(self, input_ids, image_embeds, cos, sin, past_len, *past):
        # input_ids: [B, S] int64 (B sequences, one per cache slot); image_embeds: [N, H]; cos/sin: [B, S, D] float32
        # masked: past_len [B] int64; returns logits [B, V] and the new K/V rows [B, KVH, S, D]
        # gqa: past_len is seqlens_k [B] int32 (= total - 1), followed by total_sequence_length (int32
        #      scalar, the longest total); returns logits and the updated caches (bound in place by the runtime)
        # past: L x past_key [B, KVH, MAX, D], then L x past_value [B, KVH, MAX, D]
        if self.attention == "gqa":
            return self._forward_gqa(input_ids, image_embeds, cos, sin, past_len, past[0], *past[1:])
        t, dt = self.t, self.embed.dtype
        L = t.num_layers
        b, s = input_ids.shape[0], input_ids.shape[1]
        kvh, g, d = t.num_kv_heads, self.g, t.head_dim
        x = self._embed(input_ids, image_embeds)

        dev = input_ids.device
        rows_cache = torch.arange(self.cache_len, dtype=torch.int64, device=dev).reshape(1, self.cache_len)
        past_bias = torch.where(rows_cache < past_len.reshape(b, 1), 0.0, NEG_INF).reshape(b, 1, 1, 1, self.cache_len)
        rows = torch.arange(s, dtype=torch.int64, device=dev)
        causal = torch.where(rows.reshape(1, s) <= rows.reshape(s, 1), 0.0, NEG_INF).reshape(1, 1, 1, s, s)
        cos_q, sin_q = cos.reshape(b, 1, 1, s, d), sin.reshape(b, 1, 1, s, d)
        cos_k, sin_k = cos.reshape(b, 1, s, d), sin.reshape(b, 1, s, d)
        scale = 1.0 / math.sqrt(d)
        new_k, new_v = [], []
        for i, m in enumerate(self.layers):
            h = rms_norm(x, m.ln1, t.rms_norm_eps)
            q = F.linear(h, m.q).reshape(b, s, kvh, g, d).permute(0, 2, 3, 1, 4)          # [B, KVH, G, S, D]
            k = F.linear(h, m.k).reshape(b, s, kvh, d).transpose(1, 2)                    # [B, KVH, S, D]
            v = F.linear(h, m.v).reshape(b, s, kvh, d).transpose(1, 2)
            q = rms_norm(self._rope(q, cos_q, sin_q), m.qn, t.rms_norm_eps)              # RoPE, then QK-norm
            k = rms_norm(self._rope(k, cos_k, sin_k), m.kn, t.rms_norm_eps)
            new_k.append(k)
            new_v.append(v)
            pk, pv = past[i], past[L + i]
            k5, pk5, pv5, v5 = k.unsqueeze(2), pk.unsqueeze(2), pv.unsqueeze(2), v.unsqueeze(2)
            s_past = torch.matmul(q, pk5.transpose(-1, -2)).float() * scale + past_bias   # [B, KVH, G, S, MAX]
            s_new = torch.matmul(q, k5.transpose(-1, -2)).float() * scale + causal        # [B, KVH, G, S, S]
            p = torch.softmax(torch.cat([s_past, s_new], dim=-1), dim=-1).to(dt)
            o = torch.matmul(p[..., : self.cache_len], pv5) + torch.matmul(p[..., self.cache_len:], v5)
            o = o.permute(0, 3, 1, 2, 4).reshape(b, s, t.num_heads * d)
            x = self._mlp(m, x + F.linear(o, m.o))
        return (self._logits(x), *new_k, *new_v)


class DeviceSelect(nn.Module):
    """Decoder + greedy selection in the graph (select_on_device): the runtime reads back one token id
    per step instead of the logits.  Same contract as edgeocr.decode: HF repetition penalty over the ids
    marked in `seen` (logit / p if logit > 0 else logit * p), then argmax (first index on ties).
    Extra inputs after input_ids, image_embeds, cos, sin: seen [B, V] float32 (1 = penalized), penalty
    [B] float32 (one per sequence).  Extra output after logits: next_token [B] int64."""

    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.decoder = decoder

    def forward(self, input_ids, image_embeds, cos, sin, seen, penalty, *rest):
        outs = self.decoder(input_ids, image_embeds, cos, sin, *rest)
        logits = outs[0]
        p = penalty.reshape(-1, 1)
        adj = torch.where(seen > 0, torch.where(logits < 0, logits * p, logits / p), logits)
        return (logits, torch.argmax(adj, dim=-1), *outs[1:])
