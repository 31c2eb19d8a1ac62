"""ONNX Runtime session: CPU, or CUDA with everything device-resident.

KV buffers are allocated once at load and bound by address.  Two decoder graph flavours:
- attention "masked" (portable): the decoder reads the buffers as read-only inputs and returns only the
  new rows ([1, KVH, S, D] per layer), which are copied into the buffers at `pos` (CPU: a numpy slice
  assignment; CUDA: one cudaMemcpy2DAsync per tensor).
- attention "gqa" (ONNX Runtime's GroupQueryAttention): each layer's `present_*` output is bound to the
  same buffer as its `past_*` input, so the graph writes the new rows in place and attends over the live
  length only; nothing is copied by the host at all.
Either way nothing is concatenated or copied cache-wide per step.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from edgeocr.errors import BackendError
from edgeocr.manifest import Manifest, io_dtype

log = logging.getLogger("edgeocr")

_NP = {"float32": np.float32, "float16": np.float16}


def _ort():
    try:
        import onnxruntime as ort
    except ImportError:
        raise BackendError("ONNX Runtime is not installed: pip install 'edgeocr[cpu]' "
                           "(or 'edgeocr[cuda]' for onnxruntime-gpu)") from None
    return ort


def available_providers() -> list[str]:
    try:
        return list(_ort().get_available_providers())
    except BackendError:
        return []


class OrtSession:
    """Implements edgeocr.backends.base.Session on ONNX Runtime."""

    def __init__(self, artifact: Path, m: Manifest, device: str = "cpu", threads: int | None = None,
                 cuda_graph: bool | None = None):
        ort = _ort()
        self.m = m
        kv = m.kv_cache
        self.layers, self.kvh, self.hd = kv["layers"], kv["kv_heads"], kv["head_dim"]
        self.max_len = kv["max_len"]
        self.vocab_size = m.model["text"]["vocab_size"]
        self.hidden = m.model["text"]["hidden_size"]
        self.kv_dtype = _NP[kv["dtype"]]
        # image embeddings: the vision graph's output dtype, and what the decoder takes (equal in artifacts
        # exported since image_embeds follows the compute dtype; older FP16 ones cast on the host)
        self.vis_dtype = _NP[io_dtype(m, "vision", "image_embeds")]
        self.emb_dtype = _NP[io_dtype(m, "decoder", "image_embeds")]
        self.n_image = m.preprocess["n_image_tokens"]
        self.inplace = m.graphs["decoder"].get("attention", "masked") == "gqa"
        self.selects = bool(m.graphs["decoder"].get("select_on_device", False))
        self.first_token = -1
        if cuda_graph is None:          # auto: on wherever the artifact allows it
            cuda_graph = device == "cuda" and self.inplace and self.selects
        self.cuda_graph = bool(cuda_graph)
        if self.cuda_graph and (device != "cuda" or not (self.inplace and self.selects)):
            raise BackendError("CUDA-graph decode needs device 'cuda' and an artifact exported with "
                               "--attention gqa --select-on-device (fixed buffer addresses, no host copy "
                               "inside the step)")
        if self.inplace and device == "cuda" and kv["dtype"] == "float32":
            raise BackendError("this artifact's decoder uses GroupQueryAttention, which ONNX Runtime's CUDA "
                               "provider runs in fp16/bf16 only: export it with --precision fp16 for CUDA, "
                               "or with --attention masked, or run it on the CPU")
        if device == "cpu":
            providers = ["CPUExecutionProvider"]
        elif device == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise BackendError("CUDAExecutionProvider is not available in this onnxruntime "
                                   f"(providers: {ort.get_available_providers()}); pip install 'edgeocr[cuda]'")
            # TF32 would change FP32 numerics by ~1e-3 relative; keep FP32 artifacts exact
            # arena grows by what is asked, not in powers of two (device memory is the scarce thing on Orin)
            cuda_opts = {"device_id": 0, "use_tf32": 0 if m.precision == "fp32" else 1,
                         "arena_extend_strategy": "kSameAsRequested"}
            providers = [("CUDAExecutionProvider", cuda_opts), "CPUExecutionProvider"]
        else:
            raise BackendError(f"unknown device {device!r} for onnxruntime; use 'cpu' or 'cuda'")
        self.device = device
        self.name = f"onnxruntime-{device}"
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        if threads:
            so.intra_op_num_threads = threads
        dec_providers = providers
        if self.cuda_graph:
            # the decode step is captured once and replayed; prefill runs outside it (gpu_graph_id -1)
            dec_providers = [("CUDAExecutionProvider", {**cuda_opts, "enable_cuda_graph": "1"}), "CPUExecutionProvider"]
            self._ro_prefill, self._ro_step = ort.RunOptions(), ort.RunOptions()
            self._ro_prefill.add_run_config_entry("gpu_graph_id", "-1")
            self._ro_step.add_run_config_entry("gpu_graph_id", "1")
        try:
            self.vision = ort.InferenceSession(str(artifact / m.graphs["vision"]["file"]), so, providers=providers)
            self.decoder = ort.InferenceSession(str(artifact / m.graphs["decoder"]["file"]), so, providers=dec_providers)
        except Exception as e:  # onnxruntime raises its own exception types
            raise BackendError(f"ONNX Runtime could not load the graphs in {artifact}: {e}") from None
        self._ort = ort
        if device == "cpu":
            self._init_cpu()
        else:
            self._init_cuda()

    # ---------------------------------------------------------------- CPU
    def _init_cpu(self) -> None:
        ort = self._ort
        shape = (1, self.kvh, self.max_len, self.hd)
        # past_key_i / past_value_i: [1, KVH, MAX, D], allocated once, shared with ORT by address
        self.k = [np.zeros(shape, self.kv_dtype) for _ in range(self.layers)]
        self.v = [np.zeros(shape, self.kv_dtype) for _ in range(self.layers)]
        self.binding = self.decoder.io_binding()
        self.kv_values = [ort.OrtValue.ortvalue_from_numpy(a) for a in self.k + self.v]
        self._bind_caches()
        # decode-step buffers, allocated once
        self.step_ids = np.zeros((1, 1), np.int64)            # [1, 1]
        self.step_cos = np.zeros((1, 1, self.hd), np.float32)  # [1, 1, D]
        self.step_sin = np.zeros((1, 1, self.hd), np.float32)
        self.past_len = np.zeros((1,), np.int64)               # [1]  (masked)
        self.seqlens_k = np.zeros((1,), np.int32)              # [1]  (gqa: total length - 1)
        self.total_len = np.zeros((), np.int32)                # []   (gqa: total length)
        self.no_image = np.zeros((1, self.hidden), self.emb_dtype)  # [1, H] placeholder during decode
        self.step_logits = np.zeros((1, self.vocab_size), np.float32)
        self.step_new = [np.zeros((1, self.kvh, 1, self.hd), self.kv_dtype) for _ in range(2 * self.layers)]
        self.image_embeds = None
        # selection in the graph: seen ids, penalty, chosen id (shared with ORT by address)
        self.seen = np.zeros((1, self.vocab_size), np.float32)
        self.penalty = np.ones((), np.float32)
        self.next_token = np.zeros((1,), np.int64)

    def _bind_caches(self) -> None:
        """past_* inputs (and, in place, present_* outputs for gqa) -> the preallocated buffers."""
        b = self.binding
        for i in range(self.layers):
            b.bind_ortvalue_input(f"past_key_{i}", self.kv_values[i])
            b.bind_ortvalue_input(f"past_value_{i}", self.kv_values[self.layers + i])
            if self.inplace:
                b.bind_ortvalue_output(f"present_key_{i}", self.kv_values[i])
                b.bind_ortvalue_output(f"present_value_{i}", self.kv_values[self.layers + i])

    def _bind_common(self, ids, embeds, cos, sin) -> None:
        ort, b = self._ort, self.binding
        b.bind_ortvalue_input("input_ids", ort.OrtValue.ortvalue_from_numpy(ids))
        b.bind_ortvalue_input("image_embeds", ort.OrtValue.ortvalue_from_numpy(embeds))
        b.bind_ortvalue_input("cos", ort.OrtValue.ortvalue_from_numpy(cos))
        b.bind_ortvalue_input("sin", ort.OrtValue.ortvalue_from_numpy(sin))
        if self.inplace:
            b.bind_ortvalue_input("seqlens_k", ort.OrtValue.ortvalue_from_numpy(self.seqlens_k))
            b.bind_ortvalue_input("total_sequence_length", ort.OrtValue.ortvalue_from_numpy(self.total_len))
        else:
            b.bind_ortvalue_input("past_len", ort.OrtValue.ortvalue_from_numpy(self.past_len))
        if self.selects:
            b.bind_ortvalue_input("seen", ort.OrtValue.ortvalue_from_numpy(self.seen))
            b.bind_ortvalue_input("penalty", ort.OrtValue.ortvalue_from_numpy(self.penalty))

    def encode_image(self, pixels: np.ndarray, fetch: bool = True) -> np.ndarray | None:
        pixels = np.ascontiguousarray(pixels, np.float32)
        if self.device == "cuda" and self.vis_dtype == self.emb_dtype:
            # the embeddings stay on the device, in the buffer the prefill reads
            vb = self.vision_binding
            vb.bind_cpu_input("pixels", pixels)
            vb.bind_ortvalue_output("image_embeds", self.image_dev)
            self.vision.run_with_iobinding(vb)
            self._image_dev = self.image_dev
            return self.image_dev.numpy() if fetch else None   # a copy only when asked for
        out = self.vision.run(["image_embeds"], {"pixels": pixels})[0]
        self.image_embeds = np.ascontiguousarray(out, self.emb_dtype)   # [N_img, H]
        if self.device == "cuda":
            self._image_dev = self._ort.OrtValue.ortvalue_from_numpy(self.image_embeds, "cuda", 0)
        return self.image_embeds

    def prefill(self, input_ids: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        if self.device == "cuda":
            return self._prefill_cuda(input_ids, cos, sin)
        s = int(input_ids.shape[0])
        embeds = self.image_embeds if self.image_embeds is not None else self.no_image
        self.past_len[0], self.seqlens_k[0], self.total_len[...] = 0, s - 1, s
        self._bind_common(np.ascontiguousarray(input_ids.reshape(1, s), np.int64), embeds,
                          np.ascontiguousarray(cos[None], np.float32), np.ascontiguousarray(sin[None], np.float32))
        b = self.binding
        self._bind_outputs(step=False)
        self.decoder.run_with_iobinding(b)
        if not self.inplace:
            news = b.get_outputs()[-2 * self.layers:]          # the new rows, in _out_names order
            for i in range(self.layers):
                self.k[i][:, :, :s] = news[i].numpy()
                self.v[i][:, :, :s] = news[self.layers + i].numpy()
        logits = self.step_logits[0].copy()
        if self.selects:
            self.first_token = int(self.next_token[0])
        self._bind_step_outputs()
        return logits

    def _out_names(self) -> list[str]:
        kind = "present" if self.inplace else "new"
        return (["logits"] + [f"{kind}_key_{i}" for i in range(self.layers)]
                + [f"{kind}_value_{i}" for i in range(self.layers)])

    def _bind_outputs(self, step: bool) -> None:
        """logits (+ next_token) into the preallocated host arrays; the caches in place (gqa), or the new
        rows into the step buffers (decode) / fresh arrays of the prompt's length (prefill)."""
        ort, b = self._ort, self.binding
        b.clear_binding_outputs()
        b.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(self.step_logits))
        if self.selects:
            b.bind_ortvalue_output("next_token", ort.OrtValue.ortvalue_from_numpy(self.next_token))
        if self.inplace:
            self._bind_caches()
            return
        for j, name in enumerate(self._out_names()[1:]):
            if step:
                b.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(self.step_new[j]))
            else:
                b.bind_output(name, "cpu")

    def _bind_step_outputs(self) -> None:
        self._bind_outputs(step=True)
        self._bind_common(self.step_ids, self.no_image, self.step_cos, self.step_sin)

    def step(self, token_id: int, pos: int, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        if not 0 <= pos < self.max_len:
            raise IndexError(f"cache position {pos} outside [0, {self.max_len})")
        if self.device == "cuda":
            return self._step_cuda(token_id, pos, cos, sin)
        self.step_ids[0, 0] = token_id
        self.step_cos[0, 0] = cos
        self.step_sin[0, 0] = sin
        self.past_len[0], self.seqlens_k[0], self.total_len[...] = pos, pos, pos + 1
        self.decoder.run_with_iobinding(self.binding)
        if not self.inplace:
            for i in range(self.layers):                     # write the new row at `pos`
                self.k[i][:, :, pos] = self.step_new[i][:, :, 0]
                self.v[i][:, :, pos] = self.step_new[self.layers + i][:, :, 0]
        return self.step_logits[0]

    def begin(self, prompt_ids: np.ndarray, penalty: float) -> None:
        """Selection in the graph: mark the prompt's ids as seen and set the penalty for this request."""
        if not self.selects:
            raise BackendError("this artifact selects tokens on the host (exported without --select-on-device)")
        seen = np.zeros((1, self.vocab_size), np.float32)
        seen[0, np.asarray(prompt_ids, np.int64)] = 1.0
        if self.device == "cpu":
            self.seen[...] = seen
            self.penalty[...] = penalty
        else:
            self.step_in["seen"].update_inplace(seen)
            self.step_in["penalty"].update_inplace(np.asarray(penalty, np.float32))

    def step_token(self, token_id: int, pos: int, cos: np.ndarray, sin: np.ndarray) -> int:
        """Mark `token_id` seen, run the step, return the graph's choice (8 bytes back, no logits)."""
        if not 0 <= pos < self.max_len:
            raise IndexError(f"cache position {pos} outside [0, {self.max_len})")
        if self.device == "cpu":
            self.seen[0, token_id] = 1.0
            self.step(token_id, pos, cos, sin)
            return int(self.next_token[0])
        self.cuda.memcpy_htod(self.step_in["seen"].data_ptr() + 4 * int(token_id), self.h_one.ctypes.data, 4)
        self._run_step_cuda(token_id, pos, cos, sin)
        return int(self._fetch("next_token", self.h_next)[0])

    def memory_bytes(self) -> dict:
        per = self.kvh * self.max_len * self.hd * np.dtype(self.kv_dtype).itemsize
        return {"kv_cache": 2 * self.layers * per}

    # ---------------------------------------------------------------- CUDA
    def _init_cuda(self) -> None:
        from edgeocr.backends import cudart

        ort = self._ort
        self.cuda = cudart.load()
        shape = (1, self.kvh, self.max_len, self.hd)
        self.k = [ort.OrtValue.ortvalue_from_shape_and_type(shape, self.kv_dtype, "cuda", 0) for _ in range(self.layers)]
        self.v = [ort.OrtValue.ortvalue_from_shape_and_type(shape, self.kv_dtype, "cuda", 0) for _ in range(self.layers)]
        zeros = np.zeros(shape, self.kv_dtype)
        for t in self.k + self.v:
            t.update_inplace(zeros)
        self.binding = self.decoder.io_binding()
        self.kv_values = self.k + self.v
        self._bind_caches()
        self.row_bytes = self.hd * np.dtype(self.kv_dtype).itemsize
        self.step_in = {
            "input_ids": ort.OrtValue.ortvalue_from_shape_and_type((1, 1), np.int64, "cuda", 0),
            "cos": ort.OrtValue.ortvalue_from_shape_and_type((1, 1, self.hd), np.float32, "cuda", 0),
            "sin": ort.OrtValue.ortvalue_from_shape_and_type((1, 1, self.hd), np.float32, "cuda", 0),
            "image_embeds": ort.OrtValue.ortvalue_from_numpy(np.zeros((1, self.hidden), self.emb_dtype), "cuda", 0),
        }
        self.vision_binding = self.vision.io_binding()
        self.image_dev = ort.OrtValue.ortvalue_from_shape_and_type((self.n_image, self.hidden), self.vis_dtype,
                                                                   "cuda", 0)
        self.step_out = {"logits": ort.OrtValue.ortvalue_from_shape_and_type((1, self.vocab_size), np.float32, "cuda", 0)}
        self.h_seq = np.zeros((1,), np.int32)
        self.h_total = np.zeros((), np.int32)     # GroupQueryAttention reads total_sequence_length from host memory
        if self.inplace:
            self.step_in["seqlens_k"] = ort.OrtValue.ortvalue_from_shape_and_type((1,), np.int32, "cuda", 0)
            self.step_in["total_sequence_length"] = ort.OrtValue.ortvalue_from_numpy(self.h_total)
        else:
            self.step_in["past_len"] = ort.OrtValue.ortvalue_from_shape_and_type((1,), np.int64, "cuda", 0)
            for name in self._out_names()[1:]:
                self.step_out[name] = ort.OrtValue.ortvalue_from_shape_and_type((1, self.kvh, 1, self.hd),
                                                                                self.kv_dtype, "cuda", 0)
        if self.selects:
            self.step_in["seen"] = ort.OrtValue.ortvalue_from_shape_and_type((1, self.vocab_size), np.float32, "cuda", 0)
            self.step_in["penalty"] = ort.OrtValue.ortvalue_from_numpy(np.ones((), np.float32), "cuda", 0)
            self.step_out["next_token"] = ort.OrtValue.ortvalue_from_shape_and_type((1,), np.int64, "cuda", 0)
        self.h_one = np.ones((1,), np.float32)
        self.h_logits = np.zeros((1, self.vocab_size), np.float32)   # readback targets, allocated once
        self.h_next = np.zeros((1,), np.int64)
        self.caches = self.k + self.v                                   # copy targets, in output order
        self.step_news = [self.step_out[n] for n in self._out_names()[1:]] if not self.inplace else []
        # host staging for the per-step inputs, allocated once
        self.h_ids = np.zeros((1, 1), np.int64)
        self.h_cos = np.zeros((1, 1, self.hd), np.float32)
        self.h_sin = np.zeros((1, 1, self.hd), np.float32)
        self.h_pos = np.zeros((1,), np.int64)
        self._image_dev = None
        self.image_embeds = None

    def _scatter_rows(self, news: list, pos: int, s: int) -> None:
        """Copy new rows [1, KVH, s, D] into each cache at rows [pos, pos+s): one 2-D copy per tensor."""
        for dst, src in zip(self.caches, news):
            # dst pitch: one head = MAX rows; src pitch: s rows
            self.cuda.memcpy2d(dst.data_ptr() + pos * self.row_bytes, self.max_len * self.row_bytes,
                               src.data_ptr(), s * self.row_bytes, s * self.row_bytes, self.kvh)
        self.cuda.sync()

    def _prefill_cuda(self, input_ids, cos, sin) -> np.ndarray:
        ort, b = self._ort, self.binding
        s = int(input_ids.shape[0])
        b.bind_ortvalue_input("input_ids", ort.OrtValue.ortvalue_from_numpy(
            np.ascontiguousarray(input_ids.reshape(1, s), np.int64), "cuda", 0))
        b.bind_ortvalue_input("image_embeds", self._image_dev if self._image_dev is not None else self.step_in["image_embeds"])
        b.bind_ortvalue_input("cos", ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(cos[None], np.float32), "cuda", 0))
        b.bind_ortvalue_input("sin", ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(sin[None], np.float32), "cuda", 0))
        b.clear_binding_outputs()
        b.bind_ortvalue_output("logits", self.step_out["logits"])
        if self.selects:
            b.bind_ortvalue_input("seen", self.step_in["seen"])
            b.bind_ortvalue_input("penalty", self.step_in["penalty"])
            b.bind_ortvalue_output("next_token", self.step_out["next_token"])
        if self.inplace:
            self.h_seq[0], self.h_total[...] = s - 1, s
            b.bind_ortvalue_input("seqlens_k", ort.OrtValue.ortvalue_from_numpy(self.h_seq, "cuda", 0))
            b.bind_ortvalue_input("total_sequence_length", self.step_in["total_sequence_length"])
            self._bind_caches()
        else:
            b.bind_ortvalue_input("past_len", ort.OrtValue.ortvalue_from_numpy(np.zeros((1,), np.int64), "cuda", 0))
            for name in self._out_names()[1:]:
                b.bind_output(name, "cuda", 0)
        self.decoder.run_with_iobinding(b, self._ro_prefill if self.cuda_graph else None)
        if not self.inplace:
            self._scatter_rows(b.get_outputs()[-2 * self.layers:], 0, s)
        logits = self.step_out["logits"].numpy()[0]
        if self.selects:
            self.first_token = int(self.step_out["next_token"].numpy()[0])
        b.clear_binding_outputs()
        if self.inplace:
            self._bind_caches()
        for name, val in self.step_out.items():
            b.bind_ortvalue_output(name, val)
        for name, val in self.step_in.items():
            b.bind_ortvalue_input(name, val)
        return logits

    def _fetch(self, name: str, host: np.ndarray) -> np.ndarray:
        """A step output into its preallocated host array (overwritten by the next step): no allocation."""
        self.cuda.memcpy_dtoh(host.ctypes.data, self.step_out[name].data_ptr(), host.nbytes)
        return host

    def _step_cuda(self, token_id, pos, cos, sin) -> np.ndarray:
        self._run_step_cuda(token_id, pos, cos, sin)
        return self._fetch("logits", self.h_logits)[0]

    def _run_step_cuda(self, token_id, pos, cos, sin) -> None:
        self.h_ids[0, 0], self.h_cos[0, 0], self.h_sin[0, 0], self.h_pos[0] = token_id, cos, sin, pos
        self.step_in["input_ids"].update_inplace(self.h_ids)
        self.step_in["cos"].update_inplace(self.h_cos)
        self.step_in["sin"].update_inplace(self.h_sin)
        if self.inplace:
            # total_sequence_length is an upper bound read from host memory: under a CUDA graph it is
            # baked into the capture, so there it stays at the cache length (seqlens_k carries the truth)
            self.h_seq[0], self.h_total[...] = pos, (self.max_len if self.cuda_graph else pos + 1)
            self.step_in["seqlens_k"].update_inplace(self.h_seq)
            self.decoder.run_with_iobinding(self.binding, self._ro_step if self.cuda_graph else None)
        else:
            self.step_in["past_len"].update_inplace(self.h_pos)
            self.decoder.run_with_iobinding(self.binding)
            self._scatter_rows(self.step_news, pos, 1)
