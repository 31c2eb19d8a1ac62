"""ONNX Runtime sessions, one small class per decoder flavour over a shared base.

Every buffer is allocated once at load (edgeocr.backends.memory: numpy on the CPU, device memory on CUDA)
and bound to the graphs by address, so CPU and CUDA share this code.  The KV cache holds `slots` sequences,
[slots, kv_heads, cache_len, head_dim] per layer and tensor.  A prefill runs one sequence (batch 1) on its
slot's part of the cache; a decode step runs every slot at once (batch = slots), each at its own position.

Flavours (the artifact's `decoder.attention`):
- `MaskedSession` ("masked", portable ONNX ops): the graph reads the caches and returns only the new rows,
  which are copied into the slot's rows (numpy slice on the CPU, one 2-D copy per tensor on CUDA).
- `GqaSession` ("gqa", ONNX Runtime's GroupQueryAttention): each layer's present_* output is bound to the
  buffer of its past_* input, so the graph writes its rows in place and attends over the live length only.
Either one may also select tokens in the graph (`decoder.select_on_device`: repetition penalty + argmax, one
int64 per slot read back per step); `GqaSession` on CUDA replays that step as a CUDA graph.
"""

from __future__ import annotations

import abc
import logging
import os
import threading
from pathlib import Path

import numpy as np

from edgeocr.artifact import Artifact, cuda_only_problem
from edgeocr.backends.memory import Buffer, CudaMemory, HostMemory
from edgeocr.errors import ArtifactError, BackendError
from edgeocr.ort_options import CUDA_STACK_ENV, PREFILL_GRAPH_ENV, VISION_ARENA_ENV, VISION_GRAPH_ENV

log = logging.getLogger("edgeocr")

_NP = {"float32": np.float32, "float16": np.float16}
PREFILL_GRAPHS = 64         # prefill CUDA graphs a session keeps at most (one per slot and prompt length)
GRAPH_CAPTURE_RUN = 3       # ONNX Runtime captures a graph id on its third run (two plain runs allocate first)


def _session_options(ort, device: str, threads: int | None):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    if device == "cpu":
        from edgeocr.ort_options import cpu_session_config
        for key, value in cpu_session_config().items():
            so.add_session_config_entry(key, value)
    return so


def _graph_run_options(ort, graph_id: int):
    ro = ort.RunOptions()
    ro.add_run_config_entry("gpu_graph_id", str(graph_id))
    return ro


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


def open_ort_session(path: Path, art: Artifact, device: str = "cpu", threads: int | None = None,
                     cuda_graph: bool | None = None, vision_ahead: bool | None = None) -> "OrtSession":
    """The session class for the artifact's decoder flavour.  Refuses at once an ONNX Runtime older than the
    one the artifact's graphs need (its manifest says which).  vision_ahead: whether the model's schedulers run
    visions on a worker thread (None: EDGEOCR_VISION_AHEAD); it keeps the vision graph's CUDA graph off by default."""
    from edgeocr.artifact import onnxruntime_shortfall

    short = onnxruntime_shortfall(art, _ort().__version__)
    if short:
        raise BackendError(f"{path}: {short}")
    cls = {"masked": MaskedSession, "gqa": GqaSession}.get(art.decoder.attention)
    if cls is None:
        raise ArtifactError(f"{path}: unknown decoder attention {art.decoder.attention!r}")
    if art.decoder.step_state:
        if cls is not GqaSession or not art.decoder.select_on_device:
            raise ArtifactError(f"{path}: a decoder with device-resident step state must use GroupQueryAttention "
                                "and select tokens in the graph")
        from edgeocr.backends.ort_step_state import StepStateSession
        cls = StepStateSession
    if art.decoder.native_step:
        if cls is not GqaSession or not art.decoder.select_on_device or art.decoder.step_state:
            raise ArtifactError(f"{path}: a decoder with native step weights must use GroupQueryAttention and select "
                                "tokens in the graph, without step state")
        from edgeocr.backends.native_step import NativeStepSession
        cls = NativeStepSession
    return cls(path, art, device=device, threads=threads, cuda_graph=cuda_graph, vision_ahead=vision_ahead)


class OrtSession(abc.ABC):
    """Implements edgeocr.backends.base.Session; its token selection is OrtGraphSelection when the artifact's
    graph selects, edgeocr.selection.HostSelection otherwise."""

    attention = ""              # the flavour's decoder attention
    inplace = False             # the graph updates the cache itself
    step_graphs = 1             # decode-step bindings, one CUDA graph each
    stream_priorities = False   # CUDA: decoder on a high-priority stream, vision on a low one (ort_options)
    prefill_beside_ok = False   # the flavour can prefill a slot on a second decoder session beside the step

    def __init__(self, path: Path, art: Artifact, device: str = "cpu", threads: int | None = None,
                 cuda_graph: bool | None = None, vision_ahead: bool | None = None):
        ort = _ort()
        self._vision_ahead = vision_ahead   # the model's schedulers' default (None: EDGEOCR_VISION_AHEAD)
        self.art, self._ort = art, ort
        kv = art.kv
        self.slots, self.cache_len = kv.slots, kv.cache_len
        self.layers, self.kv_heads, self.head_dim = kv.layers, kv.kv_heads, kv.head_dim
        self.vocab_size, self.hidden = art.vocab_size, art.hidden_size
        self.prefill_len = art.decoder.prefill_len
        self._graph_select = art.decoder.select_on_device     # seen/penalty in, next_token out
        self.kv_dtype = _NP[kv.dtype]
        self.emb_dtype = _NP[art.decoder.dtype_of("image_embeds")]
        if _NP[art.vision.dtype_of("image_embeds")] != self.emb_dtype:
            raise ArtifactError(f"{path}: the vision graph's image_embeds dtype differs from the decoder's; "
                                "re-export the artifact")
        self.device = device
        self.name = f"onnxruntime-{device}"
        self.cuda_graph = self._want_cuda_graph(cuda_graph)
        self._cuda_settings()
        providers, dec_providers = self._providers(ort, device)
        so = dec_so = _session_options(ort, device, threads)
        # what a second decoder session for prefills beside the step needs (open_prefill_beside)
        # (the vision's stream settings, never its CUDA graph)
        self._path, self._so = path, so
        self._pf_providers = [(p[0], {k: v for k, v in p[1].items() if k != "enable_cuda_graph"})
                              if isinstance(p, tuple) else p for p in providers]
        self.prefill_decoder = None
        self._pf_bindings = {}              # (id(decoder session), slot) -> the prefill binding (_prefill_binding)
        self._pf_prompt = None              # (ids, cos, sin) in the prefill buffers, when read-only arrays
        self.arena = "cpu" if device == "cpu" else "separate"
        if device == "cuda":
            from edgeocr.ort_options import (mem_pattern_wanted, memory_patterns, share_arena, shared_arena_wanted,
                                             vision_run_options, vision_shrink_wanted)
            try:
                shrink, shared, pattern = vision_shrink_wanted(), shared_arena_wanted(), mem_pattern_wanted()
            except ValueError as e:
                raise BackendError(str(e)) from None
            if self.vision_graph:       # the captured graph keeps its activations' addresses in the vision arena
                if os.environ.get(VISION_ARENA_ENV, "").strip().lower() == "shrink":
                    raise BackendError(f"{VISION_GRAPH_ENV}=1 keeps the vision arena (a captured graph keeps its "
                                       f"activations' addresses): unset {VISION_ARENA_ENV}=shrink")
                shrink = False
            else:
                self._ro_vision = vision_run_options(ort) if shrink else None
            if shared:
                causes = [why for on, why in (
                    (self.cuda_graph, "the decode step replays an ONNX Runtime CUDA graph (use a native-step "
                                      "artifact, or --cuda-graph off / cuda_graph=False)"),
                    (self.prefill_graph, f"{PREFILL_GRAPH_ENV}=1 (set it to 0)"),
                    (self.vision_graph, f"{VISION_GRAPH_ENV}=1 (set it to 0)"),
                    (self.stream_priorities, "EDGEOCR_STREAM_PRIORITIES=1 (unset it)")) if on]
                if causes:
                    raise BackendError("EDGEOCR_CUDA_ARENA=shared cannot serve a session that keeps addresses in the "
                                       "arena (a captured CUDA graph) or runs on prioritized streams: "
                                       + "; ".join(causes))
                try:
                    share_arena(ort, so)
                except Exception as e:  # noqa: BLE001  (onnxruntime raises its own types)
                    raise BackendError(f"EDGEOCR_CUDA_ARENA=shared: this ONNX Runtime cannot share a CUDA arena "
                                       f"({e}); unset it") from None
                self.arena = "shared"
            vis_pattern, dec_pattern = memory_patterns(pattern, self.vision_graph, self.prefill_graph)
            so.enable_mem_pattern = vis_pattern
            if dec_pattern != vis_pattern:
                dec_so = _session_options(ort, device, threads)
                dec_so.enable_mem_pattern = dec_pattern
                if shared:
                    share_arena(ort, dec_so)
            self.arena += (f", {'shrunk' if shrink else 'kept'} after vision, memory patterns: vision "
                           f"{'on' if vis_pattern else 'off'}, decoder {'on' if dec_pattern else 'off'}")
        self._set_cuda_stack()
        try:
            self.vision = ort.InferenceSession(str(path / art.vision.file), so, providers=providers)
            self.decoder = ort.InferenceSession(str(path / art.decoder.file), dec_so, providers=dec_providers)
        except Exception as e:  # onnxruntime raises its own exception types
            raise BackendError(f"ONNX Runtime could not load the graphs in {path}: {e}") from None
        self.mem = HostMemory() if device == "cpu" else CudaMemory(ort)
        self._alloc()
        self._bind_vision()
        self._bind_step()
        self.first_tokens = np.zeros((1,), np.int64)      # host copy of a prefill's selected token

    # ------------------------------------------------------------ setup
    def _cuda_settings(self) -> None:
        """CUDA only: the context's stack reservation (EDGEOCR_CUDA_STACK), and whether the prefill and the vision
        graph replay ONNX Runtime CUDA graphs (EDGEOCR_PREFILL_GRAPH, EDGEOCR_VISION_GRAPH; edgeocr.ort_options)."""
        self.prefill_graph = self.vision_graph = False
        self._stack = None
        self._ro_vision = None              # CUDA: shrink the vision arena after each call, or replay its graph
        self._ro_plain = None               # a decoder run outside every CUDA graph (where the session has some)
        self._pf_graph_ro: dict[tuple[int, int], object] = {}     # (slot, prompt length) -> its graph's RunOptions
        self._pf_graph_runs: dict[tuple[int, int, int], int] = {}   # (thread, slot, prompt length) -> runs
        self._vision_runs: dict[int, int] = {}                           # thread -> vision runs
        if self.device != "cuda":
            return
        from edgeocr.ort_options import (cuda_stack_bytes, native_vision_weights, prefill_graph_wanted,
                                         shared_arena_wanted, vision_graph_default, vision_graph_wanted)
        try:
            stack, prefill, vision = cuda_stack_bytes(), prefill_graph_wanted(), vision_graph_wanted()
            native = self.art.decoder.native_step or {}
            if prefill is None:           # the default: native-step artifacts (where it was measured), unless the
                prefill = (self.inplace and self._graph_select and bool(native)                     # arena
                           and not shared_arena_wanted())                                           # is shared
            if vision is None:            # the default: where its arena fits the memory target (8-bit vision)
                vision = vision_graph_default(native_vision_weights(self.art), self._vision_ahead)
        except ValueError as e:
            raise BackendError(str(e)) from None
        if prefill and not (self.inplace and self._graph_select):
            raise BackendError(f"{PREFILL_GRAPH_ENV}=1 needs an artifact exported with --attention gqa "
                               "--select-on-device (the prefill writes the cache in place and selects in the graph)")
        if prefill and self.step_graphs > 1:
            raise BackendError(f"{PREFILL_GRAPH_ENV}=1 cannot serve a decoder with device-resident step state (its "
                               "prefill writes into the step's alternating buffers): set it to 0")
        self.prefill_graph, self.vision_graph, self._stack = prefill, vision, stack

    def _set_cuda_stack(self) -> None:
        """The context's per-thread stack reservation (EDGEOCR_CUDA_STACK), once the provider checks passed."""
        if self.device != "cuda" or self._stack is None:
            return
        from edgeocr.backends import cudart
        try:
            cu = cudart.load()
            cu.make_current()
            cu.set_stack_limit(self._stack)
        except BackendError as e:
            raise BackendError(f"{CUDA_STACK_ENV}={self._stack}: could not set the CUDA stack limit ({e}); set "
                               f"{CUDA_STACK_ENV}=driver to keep the driver's") from None

    def _want_cuda_graph(self, cuda_graph: bool | None) -> bool:
        possible = self.device == "cuda" and self.inplace and self._graph_select
        if cuda_graph is None:           # auto: on wherever the artifact allows it
            return possible
        if cuda_graph and not possible:
            raise BackendError("CUDA-graph decode needs device 'cuda' and an artifact exported with "
                               "--attention gqa --select-on-device (fixed buffer addresses, no host copy "
                               "inside the step)")
        return bool(cuda_graph)

    def _providers(self, ort, device: str):
        fusion = self.art.export.get("fusion", {})
        if fusion.get("target") == "cuda" and fusion.get("version", 0) < 3 and self.slots > 1:
            raise ArtifactError("this artifact was fused for CUDA by an older `quantize fuse` whose decoder runs one "
                                f"slot only (it has {self.slots}): fuse the exported artifact again")
        if device != "cuda" and (why := cuda_only_problem(self.art)):
            raise BackendError(why)
        if device == "cpu":
            return ["CPUExecutionProvider"], ["CPUExecutionProvider"]
        if device != "cuda":
            raise BackendError(f"unknown device {device!r} for onnxruntime; use 'cpu' or 'cuda'")
        fp32_gqa = ("this artifact's decoder uses GroupQueryAttention, which ONNX Runtime's CUDA provider runs in "
                    "fp16/bf16 only: export it with --precision fp16 for CUDA, or with --attention masked, or run it "
                    "on the CPU") if self.inplace and self.kv_dtype == np.float32 else ""
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise BackendError("CUDAExecutionProvider is not available in this onnxruntime "
                               f"(providers: {ort.get_available_providers()}); pip install 'edgeocr[cuda]' on a "
                               "machine with an NVIDIA GPU" + (f" (and {fp32_gqa})" if fp32_gqa else ""))
        if fp32_gqa:
            raise BackendError(fp32_gqa)
        # TF32 off for FP32 artifacts (exact numerics), the arena grown by what is asked, no maximal cuDNN
        # workspace: edgeocr.ort_options
        from edgeocr.ort_options import cuda_provider_options, priority_stream_options, stream_priorities_wanted
        cuda = cuda_provider_options(self.art.precision)
        vision_cuda, dec_cuda = cuda, cuda
        self.stream_priorities = stream_priorities_wanted()
        if self.stream_priorities:        # vision on a low-priority stream, decoder on a high one (ort_options)
            from edgeocr.backends import cudart
            v, d = priority_stream_options(cudart.load())
            vision_cuda, dec_cuda = {**cuda, **v}, {**cuda, **d}
        if self.vision_graph:               # one graph for every slot (encode_image copies in and out)
            vision_cuda = {**vision_cuda, "enable_cuda_graph": "1"}
            self._ro_vision = _graph_run_options(ort, 1)
        providers = [("CUDAExecutionProvider", vision_cuda), "CPUExecutionProvider"]
        dec_providers = [("CUDAExecutionProvider", dec_cuda), "CPUExecutionProvider"]
        if not (self.cuda_graph or self.prefill_graph):
            return providers, dec_providers
        # the decode step is captured once and replayed (gpu_graph_id 1, and 2.. for further step bindings);
        # prefill graphs take the ids after those (_prefill_run_options); every other run is outside them (-1)
        self._ro_plain = _graph_run_options(ort, -1)
        if self.cuda_graph:
            self._ro_steps = [_graph_run_options(ort, i + 1) for i in range(self.step_graphs)]
            self._ro_step = self._ro_steps[0]
        return providers, [("CUDAExecutionProvider", {**dec_cuda, "enable_cuda_graph": "1"}), "CPUExecutionProvider"]

    def _prefill_run_options(self, slot: int, s: int):
        """The RunOptions of a prefill of `s` tokens into `slot` on this session's decoder: its own CUDA graph's
        (EDGEOCR_PREFILL_GRAPH), up to PREFILL_GRAPHS of them, or a run outside every graph."""
        if not self.prefill_graph:
            return self._ro_plain
        key = (slot, s)
        ro = self._pf_graph_ro.get(key)
        if ro is None:
            if len(self._pf_graph_ro) >= PREFILL_GRAPHS:
                return self._ro_plain
            ro = self._pf_graph_ro[key] = _graph_run_options(self._ort, self.step_graphs + 1 + len(self._pf_graph_ro))
        runs = (threading.get_ident(), slot, s)      # ONNX Runtime counts runs and keeps graphs per thread
        self._pf_graph_runs[runs] = self._pf_graph_runs.get(runs, 0) + 1
        return ro

    def prefill_capture_pending(self, slot: int, s: int) -> bool:
        """Whether the next prefill of `s` tokens into `slot` may capture a CUDA graph: ONNX Runtime captures in a
        mode that another thread's CUDA calls break, so the caller keeps the device otherwise idle (edgeocr.slots)."""
        key = (slot, s)
        runs = self._pf_graph_runs.get((threading.get_ident(), slot, s), 0)
        return (self.prefill_graph and runs < GRAPH_CAPTURE_RUN
                and (key in self._pf_graph_ro or len(self._pf_graph_ro) < PREFILL_GRAPHS))

    def vision_capture_pending(self) -> bool:
        """Whether the next vision call may capture its CUDA graph (EDGEOCR_VISION_GRAPH; see the prefill's)."""
        return self.vision_graph and self._vision_runs.get(threading.get_ident(), 0) < GRAPH_CAPTURE_RUN

    def _alloc(self) -> None:
        """Every buffer the session uses, once.  N = slots, P = prefill_len, D = head_dim, V = vocab."""
        mem, n, p, d = self.mem, self.slots, self.prefill_len, self.head_dim
        kv_shape = self.art.kv.shape
        self.keys = [mem.alloc(kv_shape, self.kv_dtype) for _ in range(self.layers)]     # [N, KVH, MAX, D]
        self.values = [mem.alloc(kv_shape, self.kv_dtype) for _ in range(self.layers)]
        # [N_img, H] per slot: a page's vision output waits in its slot's buffer for its prefill, so the next
        # page's vision may run (on another thread) while the other slots decode
        self.images = [mem.alloc((self.art.image.n_image_tokens, self.hidden), self.emb_dtype) for _ in range(n)]
        self.no_image = mem.alloc((1, self.hidden), self.emb_dtype)       # [1, H] placeholder while decoding
        # prefill inputs, one sequence: [1, P] ids, [1, P, D] cos/sin (bound with the prompt's length)
        self.pf_ids = mem.alloc((1, p), np.int64)
        self.pf_cos, self.pf_sin = mem.alloc((1, p, d), np.float32), mem.alloc((1, p, d), np.float32)
        self.pf_len = mem.alloc((1,), self._len_dtype)                     # [1] past_len | seqlens_k
        # decode-step inputs, every slot: [N, 1] ids, [N, 1, D] cos/sin, [N] lengths
        self.st_ids = mem.alloc((n, 1), np.int64)
        self.st_cos, self.st_sin = mem.alloc((n, 1, d), np.float32), mem.alloc((n, 1, d), np.float32)
        self.st_len = mem.alloc((n,), self._len_dtype)
        self.logits = mem.alloc((n, self.vocab_size), np.float32)          # [N, V] (prefill: row 0)
        self.h_logits = np.zeros((n, self.vocab_size), np.float32)         # host copy, read back each step
        self.h_ids = np.zeros((n, 1), np.int64)                            # host staging of step inputs
        self.h_cos, self.h_sin = np.zeros((n, 1, d), np.float32), np.zeros((n, 1, d), np.float32)
        self.h_len = np.zeros((n,), self._len_dtype)
        if self.vision_graph:       # the page in and the embeddings out at fixed addresses: one graph, every slot
            self.vision_pixels = mem.alloc((1, 3, self.art.image.canvas, self.art.image.canvas), np.float32)
            self.vision_out = mem.alloc((self.art.image.n_image_tokens, self.hidden), self.emb_dtype)
        if self._graph_select:
            self.seen = mem.alloc((n, self.vocab_size), np.float32)       # [N, V] 1 = penalized id
            self.penalty = mem.alloc((n,), np.float32)                     # [N]
            self.next = mem.alloc((n,), np.int64)                          # [N] the graph's choice per slot
            self.pf_next = mem.alloc((1,), np.int64)
            self.h_next = np.zeros((n,), np.int64)
            self.h_one = np.ones((1,), np.float32)
        self._alloc_flavour()

    _len_dtype = np.int64
    _len_name = "past_len"

    def _alloc_flavour(self) -> None:
        pass

    def _bind(self, b, name: str, buf: Buffer, shape=None, index: int | None = None, output: bool = False) -> None:
        """Bind `buf` (or its leading-dim row `index`) by address with `shape` (default: the buffer's)."""
        ptr = buf.ptr if index is None else buf.at(index)
        shape = list(buf.shape if shape is None else shape)
        fn = b.bind_output if output else b.bind_input
        fn(name, self.mem.device, 0, buf.dtype, shape, ptr)

    def _bind_vision(self) -> None:
        self.vision_bindings = []
        if self.vision_graph:
            b = self.vision.io_binding()
            self._bind(b, "pixels", self.vision_pixels)
            self._bind(b, "image_embeds", self.vision_out, output=True)
            self.vision_bindings = [b] * self.slots
            return
        for image in self.images:
            b = self.vision.io_binding()
            self._bind(b, "image_embeds", image, output=True)
            self.vision_bindings.append(b)

    def _bind_caches(self, b, index: int | None) -> None:
        """past_* (and, in place, present_*) -> every slot (index None) or slot `index` alone."""
        shape = None if index is None else [1, *self.art.kv.shape[1:]]
        for i in range(self.layers):
            for kind, bufs in (("key", self.keys), ("value", self.values)):
                self._bind(b, f"past_{kind}_{i}", bufs[i], shape, index)
                if self.inplace:
                    self._bind(b, f"present_{kind}_{i}", bufs[i], shape, index, output=True)

    def _bind_step(self) -> None:
        """The decode step's binding: made once, never changed (a CUDA graph replays these addresses)."""
        self.step_binding = b = self.decoder.io_binding()
        self._bind(b, "input_ids", self.st_ids)
        self._bind(b, "image_embeds", self.no_image)
        self._bind(b, "cos", self.st_cos)
        self._bind(b, "sin", self.st_sin)
        self._bind(b, self._len_name, self.st_len)
        self._bind_caches(b, None)
        self._bind(b, "logits", self.logits, output=True)
        if self._graph_select:
            self._bind(b, "seen", self.seen)
            self._bind(b, "penalty", self.penalty)
            self._bind(b, "next_token", self.next, output=True)
        self._bind_step_flavour(b)

    def _bind_step_flavour(self, b) -> None:
        pass

    # ------------------------------------------------------------ the seam
    def encode_image(self, pixels, slot: int = 0) -> None:
        """pixels [1, 3, S, S] float32 -> image embeddings, kept on the device for `slot`'s next prefill.
        pixels: a host array, or an OrtValue already on the device (edgeocr.preprocess_graph.DevicePreprocessor).
        Safe to call from another thread while the decoder runs, for a slot that is not decoding."""
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} outside [0, {self.slots})")
        b = self.vision_bindings[slot]
        if self.vision_graph:
            self._encode_image_graph(pixels, slot)
            return
        if isinstance(pixels, self._ort.OrtValue):
            b.bind_ortvalue_input("pixels", pixels)
        else:
            b.bind_cpu_input("pixels", np.ascontiguousarray(pixels, np.float32))
        self.vision.run_with_iobinding(b, self._ro_vision)

    def _encode_image_graph(self, pixels, slot: int) -> None:
        """The vision graph as a CUDA graph: the page copied into its fixed input buffer, the graph run (captured
        on its third run, replayed after), the embeddings copied from its fixed output into the slot's buffer."""
        cu, dst = self.mem.cuda, self.vision_pixels
        if isinstance(pixels, self._ort.OrtValue):
            shape = tuple(pixels.shape())
            if shape != dst.shape or pixels.data_type() != "tensor(float)" or pixels.device_name().lower() != "cuda":
                raise ValueError(f"pixels must be a float32 CUDA tensor of shape {dst.shape}, not "
                                 f"{pixels.data_type()} {shape} on {pixels.device_name()}")
            cu.memcpy_dtod(dst.ptr, pixels.data_ptr(), dst.nbytes)
        else:
            arr = np.ascontiguousarray(pixels, np.float32)
            if arr.shape != dst.shape:
                raise ValueError(f"pixels must have shape {dst.shape}, not {arr.shape}")
            self.mem.write(dst, arr)
        self.mem.sync()                 # the page is on the device before the graph (on its own stream) reads it
        me = threading.get_ident()      # ONNX Runtime counts runs and keeps graphs per thread
        self._vision_runs[me] = self._vision_runs.get(me, 0) + 1
        self.vision.run_with_iobinding(self.vision_bindings[slot], self._ro_vision)
        cu.memcpy_dtod(self.images[slot].ptr, self.vision_out.ptr, self.vision_out.nbytes)
        self.mem.sync()                 # in the slot's buffer before its prefill (on the decoder's stream) reads it

    def image_embeds(self, slot: int = 0) -> np.ndarray:
        """The image embeddings waiting in `slot`, [N_img, H] (a copy; diagnostics and tests)."""
        image = self.images[slot]
        return self.mem.read(image, np.zeros(image.shape, image.dtype))

    def open_prefill_beside(self) -> None:
        """A second decoder session for prefills that run on another thread while this session's step decodes
        the other slots (edgeocr.slots, prefill beside): no CUDA graph, on CUDA the vision session's stream
        settings (its own stream; the low-priority one with EDGEOCR_STREAM_PRIORITIES), bound to the same KV
        cache, image and selection buffers, with logits of its own.  It holds a second copy of the decoder's
        weights.  Safe because a prefill writes rows [0, S) of a slot the step does not decode, and the step
        writes that slot's row S meanwhile (SlotScheduler), which the page's own first step writes before it
        reads it."""
        if self.prefill_decoder is not None:
            return
        if not (self.prefill_beside_ok and self._graph_select):
            raise BackendError(f"this artifact's decoder ({self.attention} attention, selection "
                               f"{'in graph' if self._graph_select else 'on the host'}"
                               f"{', step state' if self.step_graphs > 1 else ''}) cannot prefill beside the step: "
                               "that needs --attention gqa --select-on-device without --step-state")
        try:
            self.prefill_decoder = self._ort.InferenceSession(str(self._path / self.art.decoder.file), self._so,
                                                              providers=self._pf_providers)
        except Exception as e:  # onnxruntime raises its own exception types
            raise BackendError(f"ONNX Runtime could not load a second decoder session: {e}") from None
        self.pf_logits = self.mem.alloc((1, self.vocab_size), np.float32)

    def _prefill(self, slot: int, input_ids: np.ndarray, cos: np.ndarray, sin: np.ndarray,
                 beside: bool = False) -> None:
        """beside: on the second decoder session (open_prefill_beside), from another thread than the step's."""
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} outside [0, {self.slots})")
        s = int(input_ids.shape[0])
        if s > self.prefill_len:
            raise ValueError(f"prompt of {s} tokens is longer than this artifact's prefill_len {self.prefill_len}")
        if s >= self.cache_len:           # beside the step, row S is the one the step writes for this slot
            raise ValueError(f"prompt of {s} tokens leaves no room in this artifact's {self.cache_len}-row KV cache")
        decoder = self.prefill_decoder if beside else self.decoder
        if decoder is None:
            raise BackendError("prefill beside the step before open_prefill_beside()")
        mem, b = self.mem, self._prefill_binding(decoder, slot, beside)
        prompt = (input_ids, cos, sin)
        last, self._pf_prompt = self._pf_prompt, None
        if self.prefill_decoder is not None or last is None or any(x is not y for x, y in zip(prompt, last)):
            mem.write(self.pf_ids, input_ids)
            mem.write(self.pf_cos, cos)          # 1.1 MB of RoPE tables at the real size
            mem.write(self.pf_sin, sin)
        if self.prefill_decoder is None and all(not a.flags.writeable and a.base is None for a in prompt):
            # read-only arrays that own their data (the model's prompt, shared by every page with its
            # instruction): the same contents next time they come
            self._pf_prompt = prompt
        mem.write(self.pf_len, np.asarray([self._prefill_len_value(s)], self._len_dtype))
        mem.sync()
        self._bind(b, "input_ids", self.pf_ids, [1, s])
        self._bind(b, "cos", self.pf_cos, [1, s, self.head_dim])
        self._bind(b, "sin", self.pf_sin, [1, s, self.head_dim])
        if self._graph_select:
            self._bind_prefill_select(b, slot)
        self._bind_prefill_flavour(b, s)
        decoder.run_with_iobinding(b, None if beside else self._prefill_run_options(slot, s))
        self._after_prefill(slot, s)

    def _prefill_binding(self, decoder, slot: int, beside: bool):
        """The prefill binding of `slot` on `decoder`, made on its first prefill with what never changes (the
        slot's image and cache rows, the length and logits buffers, a native-step artifact's ~100 weights): a
        prefill then rebinds only what has the prompt's length and the selection's rows, not ~200 inputs."""
        key = (id(decoder), slot)
        decoder_of, b = self._pf_bindings.get(key, (None, None))
        if decoder_of is not decoder:           # none yet, or made on a session since replaced
            b = None
        if b is None:
            b = decoder.io_binding()
            self._bind(b, "image_embeds", self.images[slot])
            self._bind(b, self._len_name, self.pf_len)
            self._bind_caches(b, slot)
            self._bind(b, "logits", self.pf_logits if beside else self.logits, [1, self.vocab_size], index=0,
                       output=True)
            self._bind_prefill_static(b)
            self._pf_bindings[key] = (decoder, b)
        return b

    def prefill(self, slot: int, input_ids: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """input_ids [S] int64 (image slots included), cos/sin [S, D] float32 -> writes the slot's cache rows
        [0, S); returns the logits of the last position, [V] float32 (a view, valid until the next call).  Arrays
        that are read-only and own their data are taken as unchanging: passed again, they are not copied again."""
        self._prefill(slot, input_ids, cos, sin)
        return self.mem.read(self.logits, self.h_logits[:1])[0]

    def _step(self, token_ids: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray,
              live: np.ndarray) -> None:
        if pos.max() >= self.cache_len or pos.min() < 0:
            raise IndexError(f"cache position outside [0, {self.cache_len}): {pos.tolist()}")
        mem = self.mem
        self.h_ids[:, 0], self.h_cos[:, 0], self.h_sin[:, 0] = token_ids, cos, sin
        self.h_len[:] = self._step_len_values(pos)
        mem.write(self.st_ids, self.h_ids)
        mem.write(self.st_cos, self.h_cos)
        mem.write(self.st_sin, self.h_sin)
        mem.write(self.st_len, self.h_len)
        mem.sync()                      # the copies have landed before the graph (on its own stream) reads them
        self._before_step(pos)
        self._run_step()
        self._after_step(pos, live)

    def _run_step(self) -> None:
        """The decode step over the bound step buffers (edgeocr.backends.native_step runs its own)."""
        self.decoder.run_with_iobinding(self.step_binding, self._ro_step if self.cuda_graph else self._ro_plain)

    def step(self, token_ids: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray,
             live: np.ndarray) -> np.ndarray:
        """One decode step of every slot: token_ids [N] int64 at cache rows pos [N]; cos/sin [N, D] float32;
        live [N] bool.  Returns logits [N, V] float32 (a view, valid until the next call).  Idle slots pass
        any token at position 0 (their row 0 is rewritten by their next prefill)."""
        self._step(token_ids, pos, cos, sin, live)
        return self.mem.read(self.logits, self.h_logits)

    def selection(self):
        from edgeocr.selection import HostSelection
        return OrtGraphSelection(self) if self._graph_select else HostSelection(self)

    def memory_bytes(self) -> dict:
        return {"kv_cache": self.art.kv.bytes}

    def _start_selection(self, seen: Buffer, slot: int, prompt_ids: np.ndarray, penalty: float) -> None:
        """In-graph selection state of a new sequence in `slot`: only its prompt's ids marked in `seen` [N, V],
        its repetition penalty.  Synced by the prefill that follows."""
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} outside [0, {self.slots})")
        row = np.zeros((self.vocab_size,), np.float32)
        row[np.asarray(prompt_ids, np.int64)] = 1.0
        self.mem.write(seen, row, offset=slot * self.vocab_size)
        self.mem.write(self.penalty, np.asarray([penalty], np.float32), offset=slot)

    # ------------------------------------------------------------ flavour hooks
    @abc.abstractmethod
    def _prefill_len_value(self, s: int) -> int:
        """The prefill's length input for a prompt of `s` tokens (past_len or seqlens_k, by flavour)."""

    @abc.abstractmethod
    def _step_len_values(self, pos: np.ndarray) -> np.ndarray:
        """The step's per-slot length inputs for the slots' cache rows `pos`."""

    def _bind_prefill_flavour(self, b, s: int) -> None:
        pass

    def _bind_prefill_static(self, b) -> None:
        pass

    def _bind_prefill_select(self, b, slot: int) -> None:
        self._bind(b, "seen", self.seen, [1, self.vocab_size], index=slot)
        self._bind(b, "penalty", self.penalty, [1], index=slot)
        self._bind(b, "next_token", self.pf_next, output=True)

    def _after_prefill(self, slot: int, s: int) -> None:
        pass

    def _before_step(self, pos: np.ndarray) -> None:
        pass

    def _after_step(self, pos: np.ndarray, live: np.ndarray) -> None:
        pass


class MaskedSession(OrtSession):
    """Portable decoder: reads the caches, returns the new rows; the session copies them into place."""

    attention = "masked"
    _len_name, _len_dtype = "past_len", np.int64          # rows already in the cache

    def _alloc_flavour(self) -> None:
        kvh, d, p, n = self.kv_heads, self.head_dim, self.prefill_len, self.slots
        # new rows: prefill [1, KVH, S <= P, D], step [N, KVH, 1, D], per layer, K then V
        self.pf_new = [self.mem.alloc((1, kvh, p, d), self.kv_dtype) for _ in range(2 * self.layers)]
        self.st_new = [self.mem.alloc((n, kvh, 1, d), self.kv_dtype) for _ in range(2 * self.layers)]

    def _new_names(self):
        return [f"new_key_{i}" for i in range(self.layers)] + [f"new_value_{i}" for i in range(self.layers)]

    def _bind_step_flavour(self, b) -> None:
        for name, buf in zip(self._new_names(), self.st_new):
            self._bind(b, name, buf, output=True)

    def _bind_prefill_flavour(self, b, s: int) -> None:
        for name, buf in zip(self._new_names(), self.pf_new):
            self._bind(b, name, buf, [1, self.kv_heads, s, self.head_dim], output=True)

    def _prefill_len_value(self, s: int) -> int:
        return 0

    def _step_len_values(self, pos: np.ndarray) -> np.ndarray:
        return pos

    def _after_prefill(self, slot: int, s: int) -> None:
        for cache, new in zip(self.keys + self.values, self.pf_new):
            self.mem.copy_rows(cache, slot, 0, new, 0, s)
        self.mem.sync()

    def _after_step(self, pos: np.ndarray, live: np.ndarray) -> None:
        for slot in np.flatnonzero(live):
            row = int(pos[slot])
            for cache, new in zip(self.keys + self.values, self.st_new):
                self.mem.copy_rows(cache, int(slot), row, new, int(slot), 1)
        self.mem.sync()


class GqaSession(OrtSession):
    """GroupQueryAttention decoder: the cache is updated in place, attention reads the live length only."""

    attention = "gqa"
    inplace = True
    prefill_beside_ok = True
    _len_name, _len_dtype = "seqlens_k", np.int32          # total length - 1, per sequence

    def _alloc_flavour(self) -> None:
        # total_sequence_length: a host scalar (GroupQueryAttention reads it from host memory on CUDA too)
        self.pf_total = np.zeros((), np.int32)
        self.st_total = np.zeros((), np.int32)

    def _bind_total(self, b, arr: np.ndarray) -> None:
        b.bind_input("total_sequence_length", "cpu", 0, np.int32, [], arr.ctypes.data)

    def _bind_step_flavour(self, b) -> None:
        self._bind_total(b, self.st_total)

    def _bind_prefill_flavour(self, b, s: int) -> None:
        self.pf_total[...] = s
        self._bind_total(b, self.pf_total)

    def _prefill_len_value(self, s: int) -> int:
        return s - 1

    def _step_len_values(self, pos: np.ndarray) -> np.ndarray:
        return pos

    def _before_step(self, pos: np.ndarray) -> None:
        # an upper bound over the batch; under a CUDA graph it is baked into the capture, so there it stays at
        # the cache length (seqlens_k carries each sequence's truth)
        # on CUDA always the cache length: the kernel's work split follows it, and a value taken from the other
        # slots' lengths would make a page's numerics depend on its neighbours
        self.st_total[...] = self.cache_len if self.device == "cuda" else int(pos.max()) + 1


class OrtGraphSelection:
    """edgeocr.selection's graph selection on an OrtSession: the penalty and argmax run in the decoder graph over
    the session's per-slot `seen` rows and penalties; only token ids come back (8 bytes per slot)."""

    where = "graph"

    def __init__(self, session: OrtSession):
        self.s = session

    def first(self, slot: int, prompt_ids: np.ndarray, penalty: float, cos: np.ndarray, sin: np.ndarray) -> int:
        return self._first(slot, prompt_ids, penalty, cos, sin, beside=False)

    def first_beside(self, slot: int, prompt_ids: np.ndarray, penalty: float, cos: np.ndarray,
                     sin: np.ndarray) -> int:
        """`first` with the prefill on the session's second decoder session (OrtSession.open_prefill_beside),
        called from the vision worker while the step decodes the other slots (edgeocr.slots, prefill beside)."""
        return self._first(slot, prompt_ids, penalty, cos, sin, beside=True)

    def _first(self, slot, prompt_ids, penalty, cos, sin, beside: bool) -> int:
        s = self.s
        s._start_selection(s.seen, slot, prompt_ids, penalty)
        s._prefill(slot, prompt_ids, cos, sin, beside=beside)
        return int(s.mem.read(s.pf_next, s.first_tokens)[0])

    def next(self, tokens: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray, live: np.ndarray,
             out: np.ndarray) -> np.ndarray:
        s = self.s
        for slot in np.flatnonzero(live):                     # each live slot's incoming token joins its seen set
            s.mem.write(s.seen, s.h_one, offset=int(slot) * s.vocab_size + int(tokens[slot]))
        s._step(tokens, pos, cos, sin, live)
        out[:] = s.mem.read(s.next, s.h_next)
        return out
