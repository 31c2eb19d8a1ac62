"""edgeocr's own decode step: the decoder's step for N slots as 8 kernels a layer (edgeocr/kernels), captured in
one CUDA graph, beside ONNX Runtime, which keeps the vision encoder and the prefill.

An artifact made by `python -m quantize native-step` holds the decoder's weights once, in decoder_step.bin, in
the kernels' layout; its decoder graph reads them as inputs.  `NativeStepSession` (a GqaSession) loads that file
into its own buffers, binds them to the graph for every prefill, and runs each decode step as the launch list
`step_plan` builds, over the session's own step buffers (ids, cos/sin, seqlens_k, seen, penalty -> next token,
logits) and its static KV cache, which the prefill wrote.

    per layer  q|k|v GEMV, RoPE + Q/K-norm + cache append, attention (split over the cache, its splits
               combined by the last block to finish), o GEMV, residual + RMSNorm, SwiGLU GEMV (gate|up with its
               activation), down GEMV, residual + RMSNorm
    GEMVs      on tensor cores (decode_gemv_tc.cu, sm_80 and later: every weight read once for all slots) with 4
               slots or more (8 for outputs under 2,048 rows) where the reduction size is a multiple of 32, else on
               the CUDA cores (decode_gemv.cu)
    around     embedding rows and the first RMSNorm; the lm_head GEMV (fp32 logits), the repetition penalty
               and the argmax in two passes (the embedding rows and the lm_head from 8-bit blocks with
               `quantize native-step --embedding int8`)

The same launch list runs two ways: `CudaStep` compiles the kernels with NVRTC for the GPU it finds (head size,
query group and slot count as compile-time constants) and replays the list as one CUDA graph (from sm_90 on with
programmatic dependent launch: each kernel is scheduled while the one before it finishes and waits for it on the
GPU; EDGEOCR_PDL=0 turns that off); `NumpyStep` runs
each kernel's numpy twin (same arguments, same rounding to the weights' dtype), which is how the CPU tests check
the plan, the weight layout and the buffer conventions against ONNX Runtime's own step.

EDGEOCR_NATIVE_STEP: unset or "1": the native step on CUDA where it applies (FP16 weights, head size 32-128 in
multiples of 32, at most 8 slots), else ONNX Runtime's step; "0": always ONNX Runtime's step; "numpy": the
numpy twin (CPU; tests and diagnostics).
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeocr.artifact import Artifact
from edgeocr.backends.ort import GqaSession, OrtGraphSelection
from edgeocr.errors import ArtifactError, BackendError

log = logging.getLogger("edgeocr")

ENV = "EDGEOCR_NATIVE_STEP"
VERSIONS = (1, 2, 3)         # of the manifest's native_step: 1 float embedding, 2 8-bit embedding, 3 the same with its
#                              8-bit tables' rows padded to a multiple of Q8_TABLE_ROWS (quantize.native_step.pad_rows)
Q8_TABLE_ROWS = 8            # ONNX Runtime's CUDA MatMulNBits runs its one-row 8-bit kernel only where N is a multiple
#                              of 8; otherwise it dequantizes the whole table into its arena on every prefill
SELECT_PARTS = 64            # blocks per slot of the first argmax pass
CHUNK = 64                   # cache rows per attention block (decode_attention.cu's CHUNK); 16 and 32 were no faster
                             # at 1 slot and slower at 8 (H200, scripts/gpu_decode_kernels.py, 2026-12-05)
MAX_SLOTS = 8                # the GEMV kernels hold one accumulator per slot in registers (the tensor-core ones:
                             # the 8 columns of an m16n8k16 product)
TENSOR_CORES = True          # the GEMVs on tensor cores (decode_gemv_tc.cu) where the GPU has mma.sync m16n8k16
                             # (sm_80 and later) and the reduction size is a multiple of 32
TC_MIN_SLOTS = 4             # ... for this many slots and more, and for outputs of fewer than TC_NARROW_ROWS rows
TC_NARROW_ROWS = 2048        # (o, down: 1,024) from 8 slots on.  H200, scripts/gpu_decode_kernels.py, 2026-12-05,
                             # best CUDA-core against tensor-core us: 1-2 slots CUDA cores everywhere (q|k|v 4.1 / 4.5,
                             # down 3.9 / 5.9); 4 slots q|k|v 4.9 / 4.7, SwiGLU 8.7 / 6.7, lm_head 75.7 / 63.6 but
                             # o 3.7 / 4.1, down 4.8 / 6.2; 8 slots tensor cores everywhere (SwiGLU 12.6 / 6.7)


PDL_ENV = "EDGEOCR_PDL"       # 1: programmatic dependent launch on sm_90 and later (half.cuh's STEP_ENTRY), 0: off
PDL_MIN_ARCH = 90


def pdl_enabled(arch: str) -> bool:
    """Whether the step's kernels launch with programmatic dependent launch on this GPU ("sm_XY"): sm_90 and later
    unless EDGEOCR_PDL=0 (the instruction it needs, griddepcontrol, exists from sm_90 on; measured on sm_90).  Any
    other value is a configuration error (ValueError, as edgeocr.ort_options' settings), not a reason to fall back."""
    v = os.environ.get(PDL_ENV, "1").strip()
    if v not in ("0", "1"):
        raise ValueError(f"{PDL_ENV} must be 0 or 1, not {v!r}")
    return v == "1" and int(arch[3:]) >= PDL_MIN_ARCH


@dataclass(frozen=True)
class Dims:
    layers: int
    hidden: int
    inter: int
    nq: int
    kvh: int
    head_dim: int
    vocab: int
    cache_len: int
    eps: float
    lm_head: str             # the tensor of the output projection: "lm_head", or "embed" when tied
    q8: bool = False         # the layers' projections as 8-bit blocks of 32 (quantize native-step --weights int8)
    q8_embed: bool = False   # the embedding (and an untied lm_head) as 8-bit blocks of 32 (--embedding int8)

    @property
    def qkv(self) -> int:
        return (self.nq + 2 * self.kvh) * self.head_dim

    @property
    def splits(self) -> int:
        return -(-self.cache_len // CHUNK)

    @classmethod
    def of(cls, art: Artifact) -> "Dims":
        t = art.model["text"]
        spec = art.decoder.native_step
        return cls(layers=t["num_layers"], hidden=t["hidden_size"], inter=t["intermediate_size"], nq=t["num_heads"],
                   kvh=t["num_kv_heads"], head_dim=t["head_dim"], vocab=t["vocab_size"], cache_len=art.kv.cache_len,
                   eps=float(t["rms_norm_eps"]), lm_head="lm_head" if "lm_head" in spec["tensors"] else "embed",
                   q8=spec.get("weights") == "int8", q8_embed=spec.get("embedding") == "int8")


@dataclass(frozen=True)
class Launch:
    kernel: str              # the numpy twin's name (NumpyStep) and the CUDA symbol's family
    symbol: str              # CUDA symbol
    grid: tuple
    block: tuple
    args: tuple              # buffer names (str), None (a null pointer), or ("i", int) / ("f", float)


def _ks(n: int, sms: int) -> int:
    """Warps that share one output row: the fewest that still give every multiprocessor two blocks."""
    for ks in (1, 2, 4, 8):
        if -(-n // (8 // ks)) >= 2 * sms:
            return ks
    return 8


def _ks_tc(n: int, sms: int) -> int:
    """Warps that share one 16-row tile of a tensor-core GEMV: the fewest that still give every multiprocessor two
    blocks."""
    for ks in (1, 2, 4, 8):
        if -(-n // (16 * (8 // ks))) >= 2 * sms:
            return ks
    return 8


def step_plan(d: Dims, slots: int, sms: int = 1, state: bool = False, tensor_cores: bool = False) -> list[Launch]:
    """The decode step of `slots` slots as a launch list (module doc).  sms: the GPU's multiprocessor count (it
    picks how many warps share a GEMV row).  state: the step takes its inputs from the device state (step_begin:
    the last step's tokens, the RoPE table's rows at each slot's row) and advances each live slot's row itself.
    tensor_cores: the GEMVs whose reduction size is a multiple of 32 as decode_gemv_tc.cu's kernels (sm_80 and
    later), the others as decode_gemv.cu's."""
    n = slots
    i_, f_ = (lambda v: ("i", int(v))), (lambda v: ("f", float(v)))

    def gemv(kind: str, w: str, x: str, y: str, rows: int, k: int, extra=()) -> Launch:
        tc = tensor_cores and k % 32 == 0 and n >= (TC_MIN_SLOTS if rows >= TC_NARROW_ROWS else 8)
        ks = _ks_tc(rows, sms) if tc else _ks(rows, sms)
        grid = (-(-rows // (16 * (8 // ks) if tc else 8 // ks)),)
        pre = "tc_" if tc else ""
        if d.q8_embed if w == f"w.{d.lm_head}" else d.q8:      # 8-bit weights and their scales
            return Launch(kind + "_q8", f"{pre}{kind}_q8_m{n}_ks{ks}", grid, (256,),
                          (x, w, w + ".scales", y, i_(rows), i_(k), *extra))
        return Launch(kind, f"{pre}{kind}_m{n}_ks{ks}", grid, (256,), (x, w, y, i_(rows), i_(k), *extra))

    def norm(delta, gamma: str) -> Launch:
        return Launch("add_rmsnorm", "add_rmsnorm", (n,), (256,), ("x", delta, gamma, "xn", i_(d.hidden), f_(d.eps)))

    plan = [Launch("step_begin", "step_begin", (n,), (128,), ("next", "live", "lens", "table_cos", "table_sin", "seen",
                                                               "ids", "cos", "sin", i_(d.vocab), i_(d.head_dim)))] \
        if state else []
    plan += [Launch("embed_rows_q8", "embed_rows_q8", (n,), (256,), ("ids", "w.embed", "w.embed.scales", "x",
                                                                      i_(d.hidden)))
             if d.q8_embed else
             Launch("embed_rows", "embed_rows", (n,), (256,), ("ids", "w.embed", "x", i_(d.hidden))),
             norm(None, "w.layers.0.ln1")]
    for li in range(d.layers):
        w = f"w.layers.{li}."
        plan += [
            gemv("gemv", w + "qkv", "xn", "qkv", d.qkv, d.hidden),
            Launch("rope_qknorm_append", "rope_qknorm_append", (d.nq + 2 * d.kvh, n), (d.head_dim,),
                   ("qkv", "cos", "sin", w + "qn", w + "kn", "lens", f"k.{li}", f"v.{li}", "q", i_(d.nq), i_(d.kvh),
                    i_(d.cache_len), f_(d.eps))),
            Launch("attn_decode", "attn_decode", (d.kvh, d.splits, n), (128,),
                   ("q", f"k.{li}", f"v.{li}", "lens", "part_o", "part_ml", "attn_count", "attn",
                    f_(d.head_dim ** -0.5), i_(d.cache_len), i_(d.splits), i_(1))),
            gemv("gemv", w + "o", "attn", "delta", d.hidden, d.nq * d.head_dim),
            norm("delta", w + "ln2"),
            gemv("swiglu", w + "gate_up", "xn", "act", d.inter, d.hidden, (i_(1), i_(d.inter))),
            gemv("gemv", w + "down", "act", "delta", d.hidden, d.inter),
            norm("delta", f"w.layers.{li + 1}.ln1" if li + 1 < d.layers else "w.norm"),
        ]
    plan += [gemv("gemvf", f"w.{d.lm_head}", "xn", "logits", d.vocab, d.hidden),
             Launch("select_partial", "select_partial", (SELECT_PARTS, n), (256,),
                    ("logits", "seen", "penalty", "sel_val", "sel_idx", i_(d.vocab))),
             Launch("select_final", "select_final", (n,), (32,),
                    ("sel_val", "sel_idx", "next", i_(SELECT_PARTS), "live" if state else None,
                     "lens" if state else None))]
    return plan


def kernel_defines(d: Dims, slots: int, tensor_cores: bool = False) -> dict[str, int]:
    """The compile-time constants the kernels are built with for this decoder and slot count; the tensor-core
    GEMVs are compiled only where step_plan takes them (they add ~3 s of NVRTC time at load)."""
    out = {"SLOTS": slots, "HEAD_DIM": d.head_dim, "GROUP": d.nq // d.kvh, "CHUNK": CHUNK}
    if tensor_cores and slots >= TC_MIN_SLOTS:
        out["TENSOR_CORES"] = 1
    return out


def scratch_shapes(d: Dims, slots: int, dtype) -> dict[str, tuple[tuple, object]]:
    """The step's own buffers: name -> (shape, dtype)."""
    n = slots
    return {"x": ((n, d.hidden), dtype), "xn": ((n, d.hidden), dtype), "qkv": ((n, d.qkv), dtype),
            "q": ((n, d.nq * d.head_dim), dtype), "attn": ((n, d.nq * d.head_dim), dtype),
            "delta": ((n, d.hidden), dtype), "act": ((n, d.inter), dtype),
            "part_o": ((n, d.nq, d.splits, d.head_dim), np.float32), "part_ml": ((n, d.nq, d.splits, 2), np.float32),
            "attn_count": ((n, d.kvh), np.int32),
            "sel_val": ((n, SELECT_PARTS), np.float32), "sel_idx": ((n, SELECT_PARTS), np.int32)}


# ---------------------------------------------------------------------------------------------- numpy twins
class NumpyStep:
    """The launch list run by each kernel's numpy twin over host arrays (name -> array).  Arithmetic in float32,
    stored in each buffer's dtype: with FP16 buffers the results round where the kernels round."""

    def __init__(self, plan: list[Launch], bufs: dict[str, np.ndarray], dtype):
        self.plan, self.b, self.dt = plan, bufs, np.dtype(dtype)

    def run(self) -> None:
        for launch in self.plan:
            getattr(self, "k_" + launch.kernel)(launch, *[self._arg(a) for a in launch.args])

    def _arg(self, a):
        if a is None or isinstance(a, tuple):
            return None if a is None else a[1]
        return self.b[a]

    def rd(self, a: np.ndarray) -> np.ndarray:
        return a.astype(self.dt).astype(np.float32)

    @staticmethod
    def f(a: np.ndarray) -> np.ndarray:
        return a.astype(np.float32)

    def k_embed_rows(self, L, ids, table, x, h):
        x[...] = table[ids.reshape(-1)[:x.shape[0]]]

    def k_embed_rows_q8(self, L, ids, table, scales, x, h):
        rows = ids.reshape(-1)[:x.shape[0]]
        x[...] = self.deq(table[rows], scales[rows])

    def k_add_rmsnorm(self, L, x, delta, gamma, xn, h, eps):
        if delta is not None:
            x[...] = self.f(x) + self.f(delta)
        xf = self.f(x)
        inv = 1.0 / np.sqrt((xf * xf).mean(-1, keepdims=True) + np.float32(eps))
        xn[...] = self.f(gamma) * self.rd(xf * inv)

    # the first n rows of w: an 8-bit lm_head is stored with its rows padded (Q8_TABLE_ROWS)
    def k_gemv(self, L, x, w, y, n, k):
        y[...] = self.f(x) @ self.f(w[:n]).T

    def k_gemvf(self, L, x, w, y, n, k):
        y[...] = self.rd(self.f(x) @ self.f(w[:n]).T)

    @staticmethod
    def deq(w: np.ndarray, scales: np.ndarray) -> np.ndarray:
        """8-bit blocks -> float32 weights: (q - 128) * scale, each scale over 32 values along k."""
        return (w.astype(np.float32) - 128.0) * np.repeat(scales.astype(np.float32), w.shape[1] // scales.shape[1],
                                                           axis=1)

    def k_gemv_q8(self, L, x, w, scales, y, n, k):
        y[...] = self.f(x) @ self.deq(w[:n], scales[:n]).T

    def k_gemvf_q8(self, L, x, w, scales, y, n, k):
        y[...] = self.rd(self.f(x) @ self.deq(w[:n], scales[:n]).T)

    def k_swiglu_q8(self, L, x, w, scales, y, n, k, gate_mul, up_off):
        self.k_swiglu(L, x, self.deq(w, scales), y, n, k, gate_mul, up_off)

    def k_swiglu(self, L, x, w, y, n, k, gate_mul, up_off):
        rows = np.arange(n) * gate_mul
        g = self.rd(self.f(x) @ self.f(w[rows]).T)
        u = self.rd(self.f(x) @ self.f(w[rows + up_off]).T)
        y[...] = self.rd(g / (1.0 + np.exp(-g))) * u

    def k_rope_qknorm_append(self, L, qkv, cos, sin, qn, kn, lens, kc, vc, q, nq, kvh, cache_len, eps):
        n, dh = qkv.shape[0], cos.shape[-1]
        half = dh // 2
        heads = self.f(qkv).reshape(n, nq + 2 * kvh, dh)
        c = self.rd(cos.reshape(n, 1, dh))
        s = self.rd(sin.reshape(n, 1, dh))
        qk = heads[:, :nq + kvh]
        rot = np.concatenate([-qk[..., half:], qk[..., :half]], axis=-1)
        r = self.rd(self.rd(qk * c) + self.rd(rot * s))
        inv = 1.0 / np.sqrt((r * r).mean(-1, keepdims=True) + np.float32(eps))
        nr = self.rd(r * inv)
        qo = self.f(qn) * nr[:, :nq]
        ko = self.f(kn) * nr[:, nq:]
        q[...] = qo.reshape(n, nq * dh)
        for s_ in range(n):
            pos = int(lens[s_])
            kc[s_, :, pos] = ko[s_]
            vc[s_, :, pos] = qkv[s_].reshape(nq + 2 * kvh, dh)[nq + kvh:]

    def k_attn_decode(self, L, q, kc, vc, lens, part_o, part_ml, count, o, scale, cache_len, n_splits, len_add):
        n, kvh, _, dh = kc.shape
        nq = q.shape[1] // dh
        g = nq // kvh
        for s_ in range(n):
            t = min(int(lens[s_]) + len_add, cache_len)
            qs = self.f(q[s_]).reshape(kvh, g, dh)
            kk, vv = self.f(kc[s_, :, :t]), self.f(vc[s_, :, :t])                     # [KVH, T, D]
            sc = np.einsum("hgd,htd->hgt", qs, kk) * np.float32(scale)
            p = np.exp(sc - sc.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            o[s_] = np.einsum("hgt,htd->hgd", p, vv).reshape(nq * dh)
        count[...] = 0                          # the kernel leaves every (slot, head) counter at 0

    def k_select_partial(self, L, logits, seen, penalty, val, idx, v):
        pass                                    # the numpy twin selects in one pass (select_final)

    def k_select_final(self, L, val, idx, nxt, parts, live, lens):
        logits, seen, p = self.b["logits"], self.b["seen"], self.b["penalty"].reshape(-1, 1)
        with np.errstate(divide="ignore", invalid="ignore"):       # an idle slot's penalty is 0
            adj = np.where(seen > 0, np.where(logits < 0, logits * p, logits / p), logits)
        nxt.reshape(-1)[...] = np.argmax(adj, axis=-1)
        if live is not None:
            lens += live

    def k_step_begin(self, L, nxt, live, lens, table_cos, table_sin, seen, ids, cos, sin, v, d):
        tok = nxt.reshape(-1)
        ids.reshape(-1)[...] = tok
        for s_ in np.flatnonzero(live):
            if 0 <= tok[s_] < v:
                seen[s_, tok[s_]] = 1.0
        cos.reshape(len(tok), d)[...] = table_cos[lens]
        sin.reshape(len(tok), d)[...] = table_sin[lens]


# ---------------------------------------------------------------------------------------------- CUDA
# what each kernel writes (argument positions) that its numpy twin computes too
OUTPUTS = {"step_begin": (5, 6, 7, 8), "embed_rows": (2,), "embed_rows_q8": (3,), "add_rmsnorm": (0, 3), "gemv": (2,),
           "gemvf": (2,), "swiglu": (2,), "gemv_q8": (3,), "gemvf_q8": (3,), "swiglu_q8": (3,),
           "rope_qknorm_append": (6, 7, 8), "attn_decode": (6, 7),
           "select_final": (2, 5)}
SOURCE = ('#include "decode_gemv.cu"\n#include "decode_gemv_tc.cu"\n#include "decode_attention.cu"\n'
          '#include "decode_step.cu"\n')


class CudaStep:
    """The launch list compiled (NVRTC, for this GPU) and replayed as one CUDA graph on a stream of its own.
    Buffers are device addresses (name -> int).  The stream does not wait for CUDA's legacy default stream: the
    session syncs that stream after writing a step's state and waits for this one after each step."""

    def __init__(self, plan: list[Launch], ptrs: dict[str, int], defines: dict[str, int], graph: bool = True,
                 pdl: bool = False):
        from edgeocr.backends import cudart, nvrtc

        self.rt = cudart.load()
        self.rt.make_current()                  # the primary context, current on this thread for the driver API
        arch, _ = nvrtc.device_arch()
        symbols = sorted({launch.symbol for launch in plan})
        self.pdl = pdl
        defines = {**defines, "PDL": 1} if pdl else defines
        self.mod = nvrtc.Module(nvrtc.compile_cubin(SOURCE, arch, defines), symbols)
        self.calls = []
        for launch in plan:
            args = []
            for a in launch.args:
                if a is None:
                    args.append(ctypes.c_void_p(0))
                elif isinstance(a, tuple):
                    args.append(ctypes.c_int(a[1]) if a[0] == "i" else ctypes.c_float(a[1]))
                else:
                    args.append(ctypes.c_void_p(ptrs[a]))
            self.calls.append((launch.symbol, launch.grid, launch.block, args))
        # non-blocking: the vision worker's copies on CUDA's legacy stream neither wait for a step nor break its
        # capture; the session syncs the legacy stream before a step and this stream after it
        self.stream = self.rt.stream_create(non_blocking=True)
        self.graph = graph
        self.exe = None

    def check(self, plan: list[Launch], bufs: dict, mem, dtype) -> list[dict]:
        """Each launch of the list on the GPU, one at a time, against its numpy twin run on the same inputs (the
        device buffers it reads, copied back first): [{"kernel", "output", "max_rel_err" | "mismatches"}].  One
        step's worth of launches; it advances the session's state like a step.  Diagnostics (tests/test_gpu.py,
        scripts/gpu_native_step.sh)."""
        twin = NumpyStep(plan, {}, dtype)
        rows = []
        self.rt.make_current()
        for launch, (symbol, grid, block, args) in zip(plan, self.calls):
            names = {a for a in launch.args if isinstance(a, str)}
            if launch.kernel == "select_final":
                names |= {"logits", "seen", "penalty"}
            twin.b = {n: mem.read(bufs[n], np.empty(bufs[n].shape, bufs[n].dtype)) for n in names}
            getattr(twin, "k_" + launch.kernel)(launch, *[twin._arg(a) for a in launch.args])
            self.mod.launch(symbol, grid, block, self.stream, args, self.pdl)
            self.rt.stream_sync(self.stream)
            for j in OUTPUTS.get(launch.kernel, ()):
                name = launch.args[j]
                if not isinstance(name, str):           # an optional output not given (None)
                    continue
                got = mem.read(bufs[name], np.empty(bufs[name].shape, bufs[name].dtype))
                want = twin.b[name]
                row = {"kernel": launch.kernel, "symbol": symbol, "output": name}
                if np.issubdtype(want.dtype, np.integer):
                    row["mismatches"] = int((got != want).sum())
                else:
                    g, w = got.astype(np.float64), want.astype(np.float64)
                    row["max_rel_err"] = float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-6))
                    row["finite"] = bool(np.isfinite(g).all())
                rows.append(row)
        return rows

    def launch_all(self) -> None:
        for symbol, grid, block, args in self.calls:
            self.mod.launch(symbol, grid, block, self.stream, args, self.pdl)

    def capture(self) -> None:
        """Record the launch list as a CUDA graph (every address is fixed at load; nothing runs)."""
        self.rt.make_current()
        self.rt.graph_capture_begin(self.stream)
        try:
            self.launch_all()
        except BaseException:
            try:                                # end the capture, but report the launch's own error
                self.rt.graph_capture_end(self.stream)
            except Exception:
                pass
            raise
        self.exe = self.rt.graph_capture_end(self.stream)

    def run(self) -> None:
        self.rt.make_current()
        if not self.graph:
            self.launch_all()
        else:
            if self.exe is None:
                self.capture()
            self.rt.graph_launch(self.exe, self.stream)
        self.rt.stream_sync(self.stream)


# ---------------------------------------------------------------------------------------------- the session
def native_mode() -> str:
    v = os.environ.get(ENV, "1").strip().lower()
    if v in ("", "1", "auto", "on", "cuda"):
        return "auto"
    if v in ("0", "off", "onnxruntime"):
        return "off"
    if v == "numpy":
        return "numpy"
    raise BackendError(f"{ENV} must be 1 (the native step where it applies), 0 (ONNX Runtime's step) or numpy, "
                       f"not {v!r}")


def cuda_problem(d: Dims, slots: int, dtype) -> str | None:
    """Why the CUDA kernels cannot run this decoder (None: they can)."""
    if np.dtype(dtype) != np.float16:
        return f"the kernels are FP16 and this artifact's weights are {np.dtype(dtype).name}"
    if d.head_dim % 32 or d.head_dim > 128:
        return f"head size {d.head_dim} (the kernels take 32, 64, 96 or 128)"
    if slots > MAX_SLOTS:
        return f"{slots} slots (the kernels take at most {MAX_SLOTS})"
    if d.hidden % 8 or d.inter % 8 or (d.nq * d.head_dim) % 8:
        return "a hidden, intermediate or attention width that is not a multiple of 8"
    if d.q8 and (d.hidden % 32 or d.inter % 32 or (d.nq * d.head_dim) % 32):
        return "8-bit weights with a reduction size that is not a multiple of 32"
    if d.q8_embed and d.hidden % 32:
        return "an 8-bit embedding with a hidden width that is not a multiple of 32"
    if d.nq % d.kvh:
        return f"{d.nq} query heads over {d.kvh} key/value heads"
    return None


_FLOATS = ("float16", "float32")


def spec_problem(art: Artifact, directory: Path | None = None) -> str | None:
    """Why an artifact's `native_step` entry cannot be what the step reads (None: it can): every tensor the step
    needs, of its shape and dtype; every weight input of the graph mapped inside its tensor; the file a plain name
    in the artifact, long enough for every tensor.  Checked before anything is bound: a row or shape past a
    tensor would have the graph read past a buffer."""
    spec = art.decoder.native_step
    if not isinstance(spec, dict):
        return f"native_step must be an object, not {type(spec).__name__}"
    if spec.get("version") not in VERSIONS:
        return (f"native step weights of version {spec.get('version')!r}; this edgeocr reads versions "
                f"{', '.join(map(str, VERSIONS))}: update edgeocr, or run `python -m quantize native-step` again")
    tensors, inputs, f = spec.get("tensors"), spec.get("inputs"), spec.get("file")
    if not isinstance(tensors, dict) or not isinstance(inputs, dict):
        return "native_step needs a tensors object and an inputs object"
    if not isinstance(f, str) or not f or Path(f).name != f or f in (".", ".."):
        return f"native_step.file must be a file name inside the artifact, not {f!r}"
    act, weights, embedding = spec.get("dtype"), spec.get("weights", "float"), spec.get("embedding", "float")
    if act not in _FLOATS or weights not in ("float", "int8") or embedding not in ("float", "int8"):
        return (f"native_step: dtype {act!r} / weights {weights!r} / embedding {embedding!r} (float16 or float32 / "
                "float or int8 / float or int8)")
    t = art.model["text"]
    H, inter, V, d = t["hidden_size"], t["intermediate_size"], t["vocab_size"], t["head_dim"]
    nq, kvh = t["num_heads"], t["num_kv_heads"]
    want = {"embed": [V, H], "norm": [H]}
    if "lm_head" in tensors:
        want["lm_head"] = [V, H]
    for i in range(t["num_layers"]):
        p = f"layers.{i}."
        want.update({p + "qkv": [(nq + 2 * kvh) * d, H], p + "o": [H, nq * d], p + "gate_up": [2 * inter, H],
                     p + "down": [H, inter], p + "ln1": [H], p + "ln2": [H], p + "qn": [d], p + "kn": [d]})
    projections = [k for k in want if k.rsplit(".", 1)[-1] in ("qkv", "o", "gate_up", "down")]
    if weights != "int8":
        projections = []
    if embedding == "int8":
        projections += [k for k in ("embed", "lm_head") if k in want]
    if embedding == "int8" and spec.get("version", 0) >= 3:     # the 8-bit tables' rows padded (VERSIONS)
        for k in ("embed", "lm_head"):
            if k in want:
                want[k] = [-(-V // Q8_TABLE_ROWS) * Q8_TABLE_ROWS, H]
    want.update({k + ".scales": [want[k][0], want[k][1] // 32] for k in projections})
    size = (Path(directory) / f).stat().st_size if directory is not None and (Path(directory) / f).is_file() else None
    for name, shape in want.items():
        e = tensors.get(name)
        if not isinstance(e, dict):
            return f"native_step.tensors has no {name!r}"
        dt = e.get("dtype", act)
        ok_dt = "uint8" if name in projections else act
        if dt != ok_dt:
            return f"native_step tensor {name} is {dt}, expected {ok_dt}"
        if e.get("shape") != shape:
            return f"native_step tensor {name} has shape {e.get('shape')}, the model's sizes say {shape}"
        off = e.get("offset")
        if not isinstance(off, int) or off < 0 or off % 256:
            return f"native_step tensor {name} has offset {off!r} (a multiple of 256 expected)"
        end = off + int(np.prod(shape)) * np.dtype(dt).itemsize
        if size is not None and end > size:
            return f"{f}: tensor {name} runs past the end of the file (truncated?)"
    graph_inputs = {e["name"] for e in art.decoder.inputs if str(e.get("name", "")).startswith("native.")}
    missing = sorted(graph_inputs - set(inputs))
    if missing:
        return f"the decoder graph reads {missing[0]}, which native_step.inputs does not map"
    for name, entry in inputs.items():
        if not (isinstance(entry, list) and len(entry) == 3 and entry[0] in want and isinstance(entry[1], int)
                and isinstance(entry[2], list)):
            return f"native_step.inputs[{name!r}] must be [tensor, first row, shape]"
        tensor, row, shape = entry
        rows, per_row = want[tensor][0], int(np.prod(want[tensor][1:]))
        count = int(np.prod(shape)) if all(isinstance(x, int) and x > 0 for x in shape) else -1
        if row < 0 or count < 0 or count % per_row or row + count // per_row > rows:
            return (f"native_step.inputs[{name!r}] (rows {row}.. of shape {shape}) does not lie inside "
                    f"{tensor} {want[tensor]}")
    return None


class NativeStepSession(GqaSession):
    """A GqaSession over a `quantize native-step` artifact: the prefill on ONNX Runtime with the weights bound as
    graph inputs, the decode step native (module doc) or, with EDGEOCR_NATIVE_STEP=0 or where the kernels do not
    apply, ONNX Runtime's."""

    def __init__(self, path: Path, art: Artifact, device: str = "cpu", threads: int | None = None,
                 cuda_graph: bool | None = None, vision_ahead: bool | None = None):
        spec = art.decoder.native_step
        why = spec_problem(art, path)
        if why:
            raise ArtifactError(f"{path}: {why}")
        self.dims = Dims.of(art)
        self.w_dtype = np.dtype(spec["dtype"])
        mode = native_mode()
        why = None
        if mode == "auto":
            why = "not on CUDA" if device != "cuda" else cuda_problem(self.dims, art.kv.slots, self.w_dtype)
            if why is None:
                try:                             # the compiler is there (compile errors surface at load, below)
                    from edgeocr.backends import nvrtc
                    nvrtc._load_nvrtc()
                except BackendError as e:
                    why = str(e)
        self._native_graph = cuda_graph is not False and os.environ.get("EDGEOCR_NATIVE_GRAPH", "1") != "0"
        self.engine = ("native-cuda" if mode == "auto" and why is None else
                       "native-numpy" if mode == "numpy" else "onnxruntime")
        if mode == "auto" and why and device == "cuda":
            log.warning("native decode step not used (%s): ONNX Runtime runs the step", why)
        if self.engine == "native-numpy" and device != "cpu":
            raise BackendError(f"{ENV}=numpy runs on the CPU only")
        self._native_path = Path(path)
        super().__init__(path, art, device=device, threads=threads,
                         cuda_graph=False if self.engine == "native-cuda" else cuda_graph, vision_ahead=vision_ahead)
        self.name = f"{self.name}+{self.engine}" if self.engine != "onnxruntime" else self.name
        # the step's CUDA graph: the native step's own, or ONNX Runtime's
        self.step_cuda_graph = self._native.graph if self.engine == "native-cuda" else self.cuda_graph

    # ------------------------------------------------------------ buffers
    def _alloc_flavour(self) -> None:
        super()._alloc_flavour()
        spec = self.art.decoder.native_step
        f = self._native_path / spec["file"]
        try:
            raw = np.memmap(f, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:               # missing, a directory, empty
            raise ArtifactError(f"{f}: cannot read the native step's weights ({e})") from None
        # the file's tensors are 256-byte aligned: one allocation and one copy of the whole file, each weight a
        # view of it (an allocation per weight rounds each up to the allocator's granularity)
        end = 0
        for name, t in spec["tensors"].items():
            dt = np.dtype(t.get("dtype", spec["dtype"]))
            end = max(end, t["offset"] + int(np.prod(t["shape"])) * dt.itemsize)
            if end > raw.size:
                raise ArtifactError(f"{f}: tensor {name} runs past the end of the file (truncated?)")
        blob = self.mem.alloc((max(1, end),), np.uint8, zero=False)
        self.mem.write(blob, raw[:end])
        del raw
        self.weights = {name: self.mem.view(blob, t["offset"], tuple(t["shape"]), t.get("dtype", spec["dtype"]))
                        for name, t in spec["tensors"].items()}
        self.native_bytes = sum(b.nbytes for b in self.weights.values())
        self._native = None
        if self.engine == "native-numpy":
            self._build_native()
        elif self.engine == "native-cuda":
            try:
                self._build_native()
            except BackendError as e:            # a compiler or driver that cannot build or load the kernels
                log.warning("native decode step not used (%s): ONNX Runtime runs the step, without a CUDA graph", e)
                self.engine, self._native = "onnxruntime", None

    def _weight_binds(self, b) -> None:
        """The graph's weight inputs, each bound to its rows of a weight buffer (gate and up: two halves of one)."""
        for name, (tensor, row, shape) in self.art.decoder.native_step["inputs"].items():
            buf = self.weights[tensor]
            ptr = buf.ptr + row * (buf.nbytes // buf.shape[0])
            b.bind_input(name, self.mem.device, 0, buf.dtype, list(shape), ptr)

    def _bind_step_flavour(self, b) -> None:
        super()._bind_step_flavour(b)
        self._weight_binds(b)

    def _bind_prefill_static(self, b) -> None:
        super()._bind_prefill_static(b)
        self._weight_binds(b)

    def _step_buffers(self) -> dict:
        """The launch list's buffers: the session's step buffers (seqlens_k is each slot's row, advanced on the
        device), the device state's (live flags, the text RoPE table), the weights and the step's scratch."""
        from edgeocr import rope

        bufs = {"ids": self.st_ids, "cos": self.st_cos, "sin": self.st_sin, "lens": self.st_len, "seen": self.seen,
                "penalty": self.penalty, "logits": self.logits, "next": self.next}
        bufs.update({f"k.{i}": k for i, k in enumerate(self.keys)})
        bufs.update({f"v.{i}": v for i, v in enumerate(self.values)})
        bufs.update({f"w.{name}": b for name, b in self.weights.items()})
        for name, (shape, dtype) in scratch_shapes(self.dims, self.slots, self.w_dtype).items():
            bufs[name] = self.mem.alloc(shape, dtype)
        r = self.art.rope
        table_cos, table_sin = rope.text_table(self.cache_len, rope.inv_freq(r.head_dim, r.theta, r.alpha))
        bufs["live"] = self.mem.alloc((self.slots,), np.int32)
        for name, table in (("table_cos", table_cos), ("table_sin", table_sin)):
            bufs[name] = self.mem.alloc(table.shape, np.float32)
            self.mem.write(bufs[name], table)
        self.mem.sync()
        return bufs

    def _build_native(self) -> None:
        d, n = self.dims, self.slots
        # the host's record of the device state (NativeStateSelection): each slot's last token, row, live flag
        self.h_tok = np.full((n,), -1, np.int64)
        self.h_pos = np.zeros((n,), np.int64)
        self.h_live = np.zeros((n,), bool)
        self.state_writes = 0                    # slots whose state the host wrote (admissions, leaves, resyncs)
        if self.engine == "native-numpy":
            bufs = self._step_buffers()
            self._native = NumpyStep(step_plan(d, n, state=True), {k: b.host for k, b in bufs.items()}, self.w_dtype)
            self._native_bufs = bufs
            return
        from edgeocr.backends import nvrtc
        arch, sms = nvrtc.device_arch()
        self._sms, self._tc = sms, TENSOR_CORES and int(arch[3:]) >= 80
        pdl = pdl_enabled(arch)
        bufs = self._step_buffers()
        self._native_bufs = bufs
        try:
            self._native = self._cuda_step(bufs, pdl)
        except BackendError as e:
            if not pdl:
                raise
            # a driver that cannot launch or capture it: the same kernels, launched one after another
            log.warning("programmatic dependent launch not used (%s): the step's kernels launch without it", e)
            self._native = self._cuda_step(bufs, False)

    def _cuda_step(self, bufs: dict, pdl: bool) -> "CudaStep":
        step = CudaStep(self._plan(), {k: b.ptr for k, b in bufs.items()},
                        kernel_defines(self.dims, self.slots, self._tc), graph=self._native_graph, pdl=pdl)
        if step.graph:
            step.capture()                       # at load, before any worker thread exists
        return step

    def _plan(self) -> list[Launch]:
        return step_plan(self.dims, self.slots, self._sms, state=True, tensor_cores=self._tc)

    # ------------------------------------------------------------ the step
    def sync_state(self, tokens: np.ndarray, pos: np.ndarray, live: np.ndarray) -> None:
        """Make the device state the caller's (the Selection protocol's arguments are the truth): a slot whose
        record differs is written from them.  Between admissions and leaves a scheduler's steps agree with the
        record, so a step writes nothing from the host."""
        live = np.asarray(live, bool)
        mem, b, wrote = self.mem, self._native_bufs, False
        for slot in range(self.slots):
            p = int(pos[slot])
            if not 0 <= p < self.cache_len:
                raise IndexError(f"cache position outside [0, {self.cache_len}): slot {slot} at {p}")
            if live[slot]:
                t = int(tokens[slot])
                if self.h_live[slot] and self.h_pos[slot] == p and self.h_tok[slot] == t:
                    continue
                mem.write(b["next"], np.asarray([t], np.int64), offset=slot)
                mem.write(b["lens"], np.asarray([p], np.int32), offset=slot)
                if not self.h_live[slot]:
                    mem.write(b["live"], np.ones((1,), np.int32), offset=slot)
                self.h_live[slot], self.h_pos[slot], self.h_tok[slot] = True, p, t
            else:
                if not self.h_live[slot] and self.h_pos[slot] == p:
                    continue
                mem.write(b["live"], np.zeros((1,), np.int32), offset=slot)
                mem.write(b["lens"], np.asarray([p], np.int32), offset=slot)     # an idle slot's row: 0, or just
                self.h_live[slot], self.h_pos[slot] = False, p                   # past a prompt prefilled beside
            wrote = True
            self.state_writes += 1
        if wrote:
            mem.sync()                    # landed before the step (on its own stream) reads them

    def _native_step(self) -> None:
        self._native.run()
        self.h_pos += self.h_live         # the step advanced each live slot's row (select_final)

    def _step(self, token_ids: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray,
              live: np.ndarray) -> None:
        """The Session seam's step: with the native step, its state taken from the arguments (cos/sin are the
        RoPE table's rows at `pos`, which the device gathers itself)."""
        if self._native is None:
            return super()._step(token_ids, pos, cos, sin, live)
        self.sync_state(token_ids, pos, live)
        self._native_step()
        self.h_tok[:] = -1                # the host has not read the new tokens

    def selection(self):
        return NativeStateSelection(self) if self._native is not None else super().selection()

    def check_kernels(self) -> list[dict]:
        """The next decode step run kernel by kernel against the numpy twins (CudaStep.check), on whatever the
        step buffers hold now (after a prefill and a step: a page's real state)."""
        if self.engine != "native-cuda":
            raise BackendError(f"check_kernels needs the native CUDA step (this session: {self.engine})")
        rows = self._native.check(self._plan(), self._native_bufs, self.mem, self.w_dtype)
        self.h_pos += self.h_live
        self.h_tok[:] = -1
        return rows

    def memory_bytes(self) -> dict:
        return {**super().memory_bytes(), "decoder_weights": self.native_bytes}


class NativeStateSelection(OrtGraphSelection):
    """Graph selection over the native step's device state: `first` prefills as OrtGraphSelection does (the
    prompt's seen row and the penalty written, the first token read back); `next` writes only what the record
    says the device lacks (a page admitted or gone), runs the step, which takes each slot's incoming token, its
    seen mark and its RoPE rows on the device and advances its row, and reads back the next tokens."""

    def next(self, tokens: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray, live: np.ndarray,
             out: np.ndarray) -> np.ndarray:
        s = self.s
        s.sync_state(tokens, pos, live)
        s._native_step()
        out[:] = s.mem.read(s.next, s.h_next)
        s.h_tok[:] = out
        return out
