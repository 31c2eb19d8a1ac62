"""The one narrow seam every backend implements (ONNX Runtime today, TensorRT next).

A session owns its graphs and its static KV cache, allocated once at load.  The caller owns the
position: `prefill` writes cache rows [0, S), `step` writes row `pos`.  Host-side RoPE tables come
in as float32 arrays; logits come back as float32 [V] on the host.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Session(Protocol):
    name: str            # "onnxruntime-cpu", "onnxruntime-cuda", "tensorrt", ...
    max_len: int         # static KV cache length, tokens
    vocab_size: int

    def encode_image(self, pixels: np.ndarray, fetch: bool = True) -> np.ndarray | None:
        """pixels: [1, 3, S, S] float32 normalized -> image embeddings [N_img, H] (kept for prefill).
        fetch=False: a device session may keep them on the device and return None."""
        ...

    def prefill(self, input_ids: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """input_ids: [S] int64 (image slots included); cos/sin: [S, D] float32.
        Writes KV rows [0, S); returns logits of the last position, [V] float32."""
        ...

    def step(self, token_id: int, pos: int, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """One decode step for `token_id` at cache row `pos`; cos/sin: [D] float32. Returns [V] float32."""
        ...

    def memory_bytes(self) -> dict:
        """{"kv_cache": bytes held by the static KV cache, ...}."""
        ...


class DeviceSelectSession(Session, Protocol):
    """Optional: a session whose graph does the greedy selection itself (`selects` is True).

    `begin(prompt_ids, penalty)` marks the prompt ids as seen; `prefill` then also records the first
    token in `first_token`; `step_token(prev, pos, cos, sin)` marks `prev` seen, runs the step and returns
    the next token id — only that id crosses to the host.  Same contract as edgeocr.decode's host path."""

    selects: bool
    first_token: int

    def begin(self, prompt_ids: np.ndarray, penalty: float) -> None: ...

    def step_token(self, token_id: int, pos: int, cos: np.ndarray, sin: np.ndarray) -> int: ...
