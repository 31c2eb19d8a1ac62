"""TensorRT session (full TensorRT or TensorRT-RTX engines from `edgeocr build-engines`), same seam as the
ONNX Runtime sessions, for one-slot artifacts (one page at a time).

Device buffers are planned once from the manifest (`plan_buffers`), allocated once with cudaMalloc and
bound to the engines' tensors once (`set_tensor_address`): the vision output is the prefill's image
input, the per-layer KV caches are shared by the prefill and decode contexts (two execution contexts
of one decoder engine, optimization profiles 0 and 1).  A decode step copies its few inputs to the
device from pinned memory, runs the decode context — captured once as a CUDA graph and replayed —
writes the new K/V rows into the caches with one 2-D device copy per tensor, and copies back the
logits, or only the next token id when the artifact selects on device.

Status: experimental (`EXPERIMENTAL`).  The buffer plan is tested on CPU and engines are built in CI ahead of
time; this class itself has not been executed yet (it needs full TensorRT on a Jetson or a TensorRT-RTX-capable
RTX GPU), so it is reachable from the Python API only (`OCRModel(..., backend="tensorrt")`, which logs
`EXPERIMENTAL` as a warning), not from `edgeocr run`, `serve` or `bench`.
"""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeocr.errors import BackendError
from edgeocr.artifact import Artifact

_NP = {"float32": np.float32, "float16": np.float16}

# Until this session has run on a GPU with TensorRT or TensorRT-RTX, opening it says so.
EXPERIMENTAL = ("the TensorRT session is experimental: its engines build, but it has not yet run on a GPU; "
                "ONNX Runtime (the default backend) is the tested path (docs/tensorrt.md)")


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class Plan:
    buffers: dict[str, Buffer] = field(default_factory=dict)
    bindings: dict[str, dict[str, str]] = field(default_factory=dict)   # context -> tensor -> buffer
    fixed_shapes: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)  # context -> input shapes

    def add(self, name: str, shape, dtype: str) -> str:
        self.buffers[name] = Buffer(name, tuple(int(x) for x in shape), dtype)
        return name

    @property
    def total_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())


def plan_buffers(m: Artifact) -> Plan:
    """Every device buffer the TensorRT session needs, and which engine tensor each context binds to it."""
    if m.decoder.attention != "masked":
        raise BackendError("TensorRT runs the portable decoder only: export with --attention masked")
    if m.slots != 1:
        raise BackendError(f"this artifact has {m.slots} slots; the TensorRT session decodes one page at a time: "
                           "export with --slots 1 for TensorRT")
    kv = m.kv
    S, N, H = m.image.canvas, m.image.n_image_tokens, m.hidden_size
    D, MAX, L, KVH = kv.head_dim, kv.cache_len, kv.layers, kv.kv_heads
    P, V = m.decoder.prefill_len, m.vocab_size
    kvdt = kv.dtype
    p = Plan()
    p.add("pixels", (1, 3, S, S), "float32")
    emb = {g: getattr(m, g).dtype_of("image_embeds") for g in ("vision", "decoder")}
    if emb["vision"] != emb["decoder"]:
        raise BackendError(f"this artifact's vision graph writes {emb['vision']} image embeddings but its decoder "
                           f"reads {emb['decoder']}: one device buffer cannot serve both; re-export it with this "
                           "edgeocr (image_embeds now follows the compute dtype)")
    p.add("image_embeds", (N, H), emb["decoder"])
    p.add("image_placeholder", (1, H), emb["decoder"])
    p.add("prefill_ids", (1, P), "int64")
    p.add("prefill_cos", (1, P, D), "float32")
    p.add("prefill_sin", (1, P, D), "float32")
    p.add("step_ids", (1, 1), "int64")
    p.add("step_cos", (1, 1, D), "float32")
    p.add("step_sin", (1, 1, D), "float32")
    p.add("past_len", (1,), "int64")
    p.add("logits", (1, V), "float32")
    p.bindings["vision"] = {"pixels": "pixels", "image_embeds": "image_embeds"}
    pre_b = {"input_ids": "prefill_ids", "image_embeds": "image_embeds", "cos": "prefill_cos",
             "sin": "prefill_sin", "past_len": "past_len", "logits": "logits"}
    dec_b = {"input_ids": "step_ids", "image_embeds": "image_placeholder", "cos": "step_cos",
             "sin": "step_sin", "past_len": "past_len", "logits": "logits"}
    if m.decoder.select_on_device:
        for b in (pre_b, dec_b):
            b.update(seen=p.add("seen", (1, V), "float32"), penalty=p.add("penalty", (1,), "float32"),
                     next_token=p.add("next_token", (1,), "int64"))
    for kind in ("key", "value"):
        for i in range(L):
            cache = p.add(f"cache_{kind}_{i}", (1, KVH, MAX, D), kvdt)
            pre_b[f"past_{kind}_{i}"] = dec_b[f"past_{kind}_{i}"] = cache
            pre_b[f"new_{kind}_{i}"] = p.add(f"prefill_new_{kind}_{i}", (1, KVH, P, D), kvdt)
            dec_b[f"new_{kind}_{i}"] = p.add(f"step_new_{kind}_{i}", (1, KVH, 1, D), kvdt)
    p.bindings["prefill"], p.bindings["decode"] = pre_b, dec_b
    p.fixed_shapes["decode"] = {"input_ids": (1, 1), "image_embeds": (1, H), "cos": (1, 1, D), "sin": (1, 1, D)}
    return p


class TrtSession:
    """Implements edgeocr.backends.base.Session on TensorRT engines (see the module doc for status)."""

    def __init__(self, artifact: Path, m: Artifact, flavour: str = "auto", cuda_graph: bool = True):
        from edgeocr.backends import cudart
        from edgeocr.trt_engines import ENGINES_FILE, check_compatible, deserialize, import_trt, make_logger

        rec_path = Path(artifact) / ENGINES_FILE
        if not rec_path.exists():
            raise BackendError(f"{artifact} has no TensorRT engines: run `edgeocr build-engines {artifact}` on this device")
        self.m, self.plan = m, plan_buffers(m)
        trt, name = import_trt(flavour)
        self.cuda = cudart.load()
        check_compatible(json.loads(rec_path.read_text()), trt.__version__, self.cuda.device_info())
        kv = m.kv
        self.layers, self.kvh, self.hd, self.cache_len = kv.layers, kv.kv_heads, kv.head_dim, kv.cache_len
        self.slots, self.vocab_size, self.hidden = 1, m.vocab_size, m.hidden_size
        self.kv_dtype = _NP[kv.dtype]
        self._graph_select = m.decoder.select_on_device
        self.name = name.replace("_", "-")
        self._logger = make_logger(trt)
        self._runtime = trt.Runtime(self._logger)        # outlives the engines
        self.engines = {}
        for g in ("vision", "decoder"):
            eng, why = deserialize(self._runtime, self._logger, (Path(artifact) / f"{g}.engine").read_bytes())
            if eng is None:
                raise BackendError(f"{g}.engine does not load here (TensorRT: {why}): rebuild it with "
                                   f"`edgeocr build-engines {artifact}`")
            self.engines[g] = eng
        self.stream = self.cuda.stream_create()
        self.ptr = {b.name: self.cuda.malloc(b.nbytes) for b in self.plan.buffers.values()}
        for b in self.plan.buffers.values():
            self.cuda.memset(self.ptr[b.name], b.nbytes)
        self.ctx = {"vision": self.engines["vision"].create_execution_context(),
                    "prefill": self.engines["decoder"].create_execution_context(),
                    "decode": self.engines["decoder"].create_execution_context()}
        self.ctx["prefill"].set_optimization_profile_async(0, self.stream)
        self.ctx["decode"].set_optimization_profile_async(1, self.stream)
        for cname, binds in self.plan.bindings.items():
            for tensor, buf in binds.items():
                if not self.ctx[cname].set_tensor_address(tensor, self.ptr[buf]):
                    raise BackendError(f"TensorRT rejected the address of {tensor!r} in the {cname} context")
        for tensor, shape in self.plan.fixed_shapes["decode"].items():
            self.ctx["decode"].set_input_shape(tensor, shape)
        # pinned host staging for the per-step copies
        self._pin = {}
        for key, shape, dt in (("ids", (1, 1), np.int64), ("cos", (1, 1, self.hd), np.float32),
                               ("sin", (1, 1, self.hd), np.float32), ("pos", (1,), np.int64),
                               ("logits", (1, self.vocab_size), np.float32), ("next", (1,), np.int64),
                               ("one", (1,), np.float32)):
            nbytes = int(np.prod(shape)) * np.dtype(dt).itemsize
            addr = self.cuda.host_alloc(nbytes)
            self._pin[key] = np.frombuffer((ctypes.c_byte * nbytes).from_address(addr), dtype=dt).reshape(shape)
        self._pin["one"][0] = 1.0
        self.row_bytes = self.hd * np.dtype(self.kv_dtype).itemsize
        self.cuda_graph, self._graph, self._warm = cuda_graph, None, False
        self.has_image = False           # the vision engine has filled the image_embeds buffer

    # -- helpers
    def _h2d(self, buf: str, arr: np.ndarray) -> None:
        a = np.ascontiguousarray(arr)
        self.cuda.memcpy_async(self.ptr[buf], a.ctypes.data, a.nbytes, "htod", self.stream)

    def _fetch(self, pin: str, buf: str) -> np.ndarray:
        """Device buffer -> its pinned host array (overwritten by the next fetch), after the stream drains."""
        a = self._pin[pin]
        self.cuda.memcpy_async(a.ctypes.data, self.ptr[buf], a.nbytes, "dtoh", self.stream)
        self.cuda.stream_sync(self.stream)
        return a

    def _scatter(self, prefix: str, pos: int, s: int) -> None:
        for kind in ("key", "value"):
            for i in range(self.layers):
                self.cuda.memcpy2d_async(self.ptr[f"cache_{kind}_{i}"] + pos * self.row_bytes,
                                         self.cache_len * self.row_bytes, self.ptr[f"{prefix}_new_{kind}_{i}"],
                                         s * self.row_bytes, s * self.row_bytes, self.kvh, self.stream)

    def _run(self, cname: str) -> None:
        if not self.ctx[cname].execute_async_v3(self.stream):
            raise BackendError(f"TensorRT {cname} execution failed")

    # -- Session (one slot: `slot` is always 0, every array has one row)
    def encode_image(self, pixels: np.ndarray, slot: int = 0) -> None:
        if slot != 0:
            raise IndexError(f"slot {slot}: the TensorRT session has one slot")
        self._h2d("pixels", np.asarray(pixels, np.float32))
        self._run("vision")
        self.has_image = True

    def _prefill(self, slot: int, input_ids: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
        if slot != 0:
            raise IndexError(f"slot {slot}: the TensorRT session has one slot")
        s = int(input_ids.shape[0])
        c = self.ctx["prefill"]
        c.set_input_shape("input_ids", (1, s))
        c.set_input_shape("cos", (1, s, self.hd))
        c.set_input_shape("sin", (1, s, self.hd))
        n = self.plan.buffers["image_embeds"].shape[0] if self.has_image else 1
        c.set_input_shape("image_embeds", (n, self.hidden))
        self._h2d("prefill_ids", np.asarray(input_ids, np.int64).reshape(1, s))
        self._h2d("prefill_cos", np.asarray(cos, np.float32))
        self._h2d("prefill_sin", np.asarray(sin, np.float32))
        self._h2d("past_len", np.zeros((1,), np.int64))
        self._run("prefill")
        self._scatter("prefill", 0, s)

    def prefill(self, slot: int, input_ids: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        self._prefill(slot, input_ids, cos, sin)
        return self._fetch("logits", "logits")[0]

    def _decode(self, token_id: int, pos: int, cos: np.ndarray, sin: np.ndarray) -> None:
        if not 0 <= pos < self.cache_len:
            raise IndexError(f"cache position {pos} outside [0, {self.cache_len})")
        pin = self._pin
        pin["ids"][0, 0], pin["cos"][0, 0], pin["sin"][0, 0], pin["pos"][0] = token_id, cos, sin, pos
        for key, buf in (("ids", "step_ids"), ("cos", "step_cos"), ("sin", "step_sin"), ("pos", "past_len")):
            self.cuda.memcpy_async(self.ptr[buf], pin[key].ctypes.data, pin[key].nbytes, "htod", self.stream)
        if self._graph is not None:
            self.cuda.graph_launch(self._graph, self.stream)
        elif self.cuda_graph and self._warm:          # capture once, after one plain run
            self.cuda.graph_capture_begin(self.stream)
            self._run("decode")
            self._graph = self.cuda.graph_capture_end(self.stream)
            self.cuda.graph_launch(self._graph, self.stream)
        else:
            self._run("decode")
            self._warm = True
        self._scatter("step", pos, 1)

    def step(self, token_ids: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray,
             live: np.ndarray) -> np.ndarray:
        self._decode(int(token_ids[0]), int(pos[0]), cos[0], sin[0])
        return self._fetch("logits", "logits")           # [1, V], a view valid until the next step (as on ORT)

    def memory_bytes(self) -> dict:
        kv = sum(b.nbytes for n, b in self.plan.buffers.items() if n.startswith("cache_"))
        return {"kv_cache": kv, "device_buffers": self.plan.total_bytes}

    def prefill_capture_pending(self, slot: int, s: int) -> bool:
        return False                                     # the engines' own CUDA graph is the step's

    def vision_capture_pending(self) -> bool:
        return False

    def selection(self):
        from edgeocr.selection import HostSelection
        return TrtGraphSelection(self) if self._graph_select else HostSelection(self)


class TrtGraphSelection:
    """edgeocr.selection's graph selection on a TrtSession (one slot): the seen row and penalty live in the
    engine's buffers, only the token id comes back."""

    where = "graph"

    def __init__(self, session: TrtSession):
        self.s = session

    def first(self, slot: int, prompt_ids: np.ndarray, penalty: float, cos: np.ndarray, sin: np.ndarray) -> int:
        s = self.s
        seen = np.zeros((1, s.vocab_size), np.float32)
        seen[0, np.asarray(prompt_ids, np.int64)] = 1.0
        s._h2d("seen", seen)
        s._h2d("penalty", np.asarray([penalty], np.float32))
        s.cuda.stream_sync(s.stream)
        s._prefill(slot, prompt_ids, cos, sin)
        return int(s._fetch("next", "next_token")[0])

    def next(self, tokens: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray, live: np.ndarray,
             out: np.ndarray) -> np.ndarray:
        s = self.s
        s.cuda.memcpy_async(s.ptr["seen"] + 4 * int(tokens[0]), s._pin["one"].ctypes.data, 4, "htod", s.stream)
        s._decode(int(tokens[0]), int(pos[0]), cos[0], sin[0])
        out[:] = s._fetch("next", "next_token")
        return out
