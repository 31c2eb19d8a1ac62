"""The one narrow seam every backend implements (ONNX Runtime and TensorRT).

A session owns its graphs and its static KV cache of `slots` sequences, allocated once at load.  The caller
owns the positions: `prefill` writes rows [0, S) of one slot, `step` writes row `pos[i]` of every slot i.
Host-side RoPE tables come in as float32 arrays; logits come back as float32 on the host.  How tokens are chosen
from a run is the session's token selection strategy (`selection()`, edgeocr.selection), fixed by its artifact.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from edgeocr.selection import Selection


@runtime_checkable
class Session(Protocol):
    name: str            # "onnxruntime-cpu", "onnxruntime-cuda", "tensorrt", ...
    slots: int           # sequences decoded at once
    cache_len: int       # static KV cache rows per slot, tokens
    vocab_size: int

    def encode_image(self, pixels: np.ndarray, slot: int = 0) -> None:
        """pixels: [1, 3, S, S] float32 normalized -> image embeddings, kept for `slot`'s next prefill.  May run
        on another thread while the decoder steps the other slots."""
        ...

    def prefill(self, slot: int, input_ids: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """input_ids: [S] int64 (image slots included); cos/sin: [S, D] float32.
        Writes the slot's KV rows [0, S); returns logits of the last position, [V] float32."""
        ...

    def step(self, token_ids: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray,
             live: np.ndarray) -> np.ndarray:
        """One decode step of every slot: token_ids [N] int64 at rows pos [N] int64; cos/sin [N, D] float32;
        live [N] bool (idle slots' rows are don't-cares).  Returns logits [N, V] float32."""
        ...

    def memory_bytes(self) -> dict:
        """{"kv_cache": bytes held by the static KV cache, ...}."""
        ...

    def prefill_capture_pending(self, slot: int, s: int) -> bool:
        """Whether the next prefill of `s` tokens into `slot` may capture a CUDA graph, during which no other
        thread may use the device (the scheduler then waits for the visions in flight first)."""
        ...

    def vision_capture_pending(self) -> bool:
        """Whether the next encode_image may capture a CUDA graph (the scheduler then runs it on its own thread
        with nothing else in flight)."""
        ...

    def selection(self) -> "Selection":
        """A token selection strategy over this session (edgeocr.selection): host selection over the logits, or
        the graph's own when the artifact selects on device.  One per scheduler: it holds per-slot state."""
        ...
