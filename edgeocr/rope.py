"""XD-RoPE on the host: 4-axis position ids and cos/sin tables (spec §4).

Positions: every token gets its sequence index on all four axes (p, w, h, t); the image's grid
tokens (between its begin and end slots) get w = column (the newline column included), h = row and
t = image ordinal.  Two layouts map axes onto head dims (spec §4.3):
- "B" (transformers >= 5.13): the full-width [cos, cos] vector is split into chunks of 2*section;
  chunk i takes axis i.
- "A" (Tencent training code, vLLM): frequency j takes the axis of the section it falls in, and
  dims j and j + D/2 share it.
They agree for all text tokens and every decode step.
"""

from __future__ import annotations

import numpy as np

LAYOUTS = ("A", "B")


def inv_freq(head_dim: int, theta: float, alpha: float | None) -> np.ndarray:
    """[D/2] float32, NTK-alpha base as transformers computes it (float32 pow)."""
    base = theta * alpha ** (head_dim / (head_dim - 2)) if alpha else theta
    exps = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (np.float32(1.0) / np.power(np.float32(base), exps, dtype=np.float32)).astype(np.float32)


def position_ids(n_tokens: int, image_start: int | None, grid_hw: tuple[int, int] | None,
                 merge: int, n_axes: int = 4) -> np.ndarray:
    """[n_axes, n_tokens] int64.  `image_start` is the index of the image's first slot (its begin
    token); `grid_hw` the ViT patch grid (gh, gw)."""
    pos = np.tile(np.arange(n_tokens, dtype=np.int64), (n_axes, 1))
    if image_start is not None:
        gh, gw = grid_hw[0] // merge, grid_hw[1] // merge
        rows, cols = np.meshgrid(np.arange(gh), np.arange(gw + 1), indexing="ij")
        a, b = image_start + 1, image_start + 1 + gh * (gw + 1)
        if b > n_tokens:
            raise ValueError("image grid runs past the end of the sequence")
        off = n_axes - 3
        pos[off, a:b] = cols.reshape(-1)
        pos[off + 1, a:b] = rows.reshape(-1)
        pos[off + 2, a:b] = 0
    return pos


def axis_of_dim(head_dim: int, sections: tuple[int, ...], layout: str) -> np.ndarray:
    """[D] int: which position axis drives each of the D head dims."""
    if layout == "B":
        return np.concatenate([np.full(2 * s, i % len(sections)) for i, s in enumerate(sections)])
    if layout == "A":
        half = np.concatenate([np.full(s, i) for i, s in enumerate(sections)])
        return np.concatenate([half, half])
    raise ValueError(f"unknown rope layout {layout!r}; expected one of {LAYOUTS}")


def cos_sin(pos: np.ndarray, freqs: np.ndarray, sections: tuple[int, ...], layout: str) -> tuple[np.ndarray, np.ndarray]:
    """pos [n_axes, S] -> (cos, sin), each [S, D] float32."""
    d = 2 * freqs.shape[0]
    axis = axis_of_dim(d, sections, layout)                        # [D]
    f = np.concatenate([freqs, freqs])                             # [D]
    angles = pos[axis, :].T.astype(np.float32) * f[None, :]        # [S, D]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def text_table(max_len: int, freqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin for positions 0..max_len-1 with all axes equal (decode steps): [MAX, D] each."""
    angles = np.arange(max_len, dtype=np.float32)[:, None] * np.concatenate([freqs, freqs])[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
