"""How fast can a decode step's matrix-vector products and attention be on this GPU?  Hand-written FP16
kernels (edgeocr/kernels/decode_gemv.cu and decode_attention.cu, compiled by NVRTC) against cuBLAS
(torch.matmul, the library ONNX Runtime's MatMul calls) and torch's scaled_dot_product_attention at the real
decoder's shapes, for 1 and 8 slots.

    python scripts/gpu_decode_kernels.py --json OUT.json      on a CUDA machine with CUDA torch
    python scripts/gpu_decode_kernels.py --compile-only sm_87 sm_89 sm_90
                                                              NVRTC only (no GPU, no torch): checks that the
                                                              kernels compile for those architectures

Each operation runs as 24 launches over 24 distinct weight matrices (one per layer, so nothing stays in L2
between layers, as in a real step), captured in one CUDA graph and replayed; the figure is the mean time per
launch.  The per-layer sum compares what a fused decoder layer runs today (q|k|v, o, gate, up and down as
separate cuBLAS GEMMs, then SiLU and Mul as two elementwise kernels) with the custom kernels (q|k|v, o, one
SwiGLU kernel for gate|up with its activation, down).  Every custom result is checked against an FP32
reference.  Attention: one new token per slot against a 4,096-row cache filled to DEPTH rows (default 1,221,
the mean depth of a 256-token page after the 1,093-token prompt), 24 distinct caches, the custom kernel (split
over the cache and combined in one launch, then checked at other depths, each slot at its own) against SDPA
(GQA) over the same rows; ONNX Runtime's GroupQueryAttention took 12 us a layer
for its decode kernel in docs/perf.md's profile.  The byte floor of each operation is the bytes it must read
(weights; the cache rows) over the GPU's memory bandwidth (--bandwidth-gbs, default the H200's 4,800 GB/s).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))            # edgeocr from the source tree
KERNELS = Path(__file__).resolve().parents[1] / "edgeocr" / "kernels" / "decode_gemv.cu"
ATTENTION = KERNELS.with_name("decode_attention.cu")
ATTN_KERNELS = ("attn_decode",)
Q_HEADS, KV_HEADS, HEAD_DIM, CACHE_LEN, CHUNK = 16, 8, 128, 4096, 64     # CHUNK: decode_attention.cu's
SLOTS = (1, 2, 4, 8)                   # the M values the source instantiates
SPLITS = (1, 2, 4, 8)                  # KS: warps that share one output row
# the real HunyuanOCR decoder (quantize/realsize.py): hidden 1,024, 16 query heads and 8 key/value heads of 128,
# intermediate 3,584, vocabulary 120,818
SHAPES = {                             # name: (kernel, output rows n, reduction k)
    "qkv": ("gemv", 4096, 1024),
    "o": ("gemv", 1024, 2048),
    "gate_up": ("swiglu", 3584, 1024),
    "gate": ("gemv", 3584, 1024),      # today's separate gate (and up) GEMM, for the per-layer comparison
    "down": ("gemv", 1024, 3584),
    "lm_head": ("gemv", 120818, 1024),
}
LAYERS = 24


# ------------------------------------------------------------------------------------------------ NVRTC
def compile_cubin(source: str, arch: str, name: str = "decode_gemv.cu", defines: dict | None = None) -> bytes:
    """The source compiled for `arch` (e.g. sm_90) by NVRTC (edgeocr.backends.nvrtc, which gives it the kernels'
    headers); a compile error raises with NVRTC's log."""
    from edgeocr.backends.nvrtc import compile_cubin as nvrtc_compile
    return nvrtc_compile(source, arch, defines=defines, name=name)


# kernel, output rows per warp (tc_*: decode_gemv_tc.cu's tensor-core kernels, a warp per 16 rows)
VARIANTS = {"gemv": (("gemv", 1), ("gemv2", 2), ("tc_gemv", 16)), "swiglu": (("swiglu", 1), ("tc_swiglu", 16))}
GEMV_SOURCE = '#include "decode_gemv.cu"\n#include "decode_gemv_tc.cu"\n'


def kernel_names() -> list[str]:
    return [f"{name}_m{m}_ks{ks}" for vs in VARIANTS.values() for name, _ in vs for m in SLOTS for ks in SPLITS]


# ------------------------------------------------------------------------------------------- driver API
class Module:
    """The compiled kernels in the current CUDA context (torch's), launched on a given stream."""

    def __init__(self, cubin: bytes, names: list[str] | tuple[str, ...]):
        self.cu = ctypes.CDLL("libcuda.so.1")
        mod = ctypes.c_void_p()
        self._check(self.cu.cuModuleLoadData(ctypes.byref(mod), cubin), "cuModuleLoadData")
        self.mod, self.fns = mod, {}
        for name in names:
            fn = ctypes.c_void_p()
            rc = self.cu.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode())
            self._check(rc, f"cuModuleGetFunction({name})")
            self.fns[name] = fn

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc:
            raise RuntimeError(f"{what} failed with CUDA driver error {rc}")

    def launch(self, name: str, grid: int, x: int, w: int, y: int, n: int, k: int, stream: int) -> None:
        """A GEMV / SwiGLU kernel: 256 threads a block (SwiGLU: gate and up rows interleaved)."""
        extra = [ctypes.c_int(2), ctypes.c_int(1)] if "swiglu" in name else []
        self.launch_args(name, (grid, 1, 1), 256, stream, [ctypes.c_void_p(x), ctypes.c_void_p(w),
                                                          ctypes.c_void_p(y), ctypes.c_int(n), ctypes.c_int(k),
                                                          *extra])

    def launch_args(self, name: str, grid: tuple[int, int, int], threads: int, stream: int, args: list) -> None:
        params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
        self._check(self.cu.cuLaunchKernel(self.fns[name], *grid, threads, 1, 1, 0, ctypes.c_void_p(stream),
                                           params, None), f"cuLaunchKernel({name})")


def grid_for(n: int, ks: int, rows_per_warp: int = 1) -> int:
    rows = 8 // ks * rows_per_warp
    return (n + rows - 1) // rows


# ------------------------------------------------------------------------------------------------ bench
def _time_graph(torch, body, replays: int) -> float:
    """Mean seconds per replay of a CUDA graph that runs `body()` once."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                          # warm-up outside the capture (cuBLAS picks its kernels)
        body()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(replays):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / 1e3 / replays


def bench(args) -> dict:
    import torch

    dev = torch.device("cuda")
    torch.zeros(1, device=dev)                          # the primary context, current on this thread
    props = torch.cuda.get_device_properties(dev)
    arch = f"sm_{props.major}{props.minor}"
    t = time.perf_counter()
    mod = Module(compile_cubin(GEMV_SOURCE, arch, "decode_gemvs.cu", {"TENSOR_CORES": 1}), kernel_names())
    attn = {c: Module(compile_cubin(ATTENTION.read_text(), arch, ATTENTION.name, {"CHUNK": c}), ATTN_KERNELS)
            for c in args.chunks}
    out = {"device": props.name, "arch": arch, "sms": props.multi_processor_count,
           "nvrtc_compile_s": round(time.perf_counter() - t, 2), "torch": torch.__version__,
           "layers": LAYERS, "replays": args.replays, "bandwidth_gbs": args.bandwidth_gbs, "ops": {}}
    gen = torch.Generator(device=dev).manual_seed(0)
    for name, (kind, n, k) in ([] if args.only == "attention" else SHAPES.items()):
        layers = 1 if name == "lm_head" else LAYERS
        rows_w = 2 * n if kind == "swiglu" else n
        # weights [rows_w, k] row-major for the custom kernels; cuBLAS gets ONNX's layout, [k, rows_w]
        w = [torch.randn(rows_w, k, device=dev, generator=gen, dtype=torch.float16) * (k ** -0.5)
             for _ in range(layers)]
        w_onnx = [wi.t().contiguous() for wi in w]
        for m in args.slots:
            x = torch.randn(m, k, device=dev, generator=gen, dtype=torch.float16)
            y_ref = torch.empty(m, rows_w, device=dev, dtype=torch.float16)
            y = torch.empty(m, n, device=dev, dtype=torch.float16)
            weight_bytes = rows_w * k * 2
            row = {"n": n, "k": k, "slots": m, "weight_mib": round(weight_bytes / 2**20, 2),
                   "byte_floor_us": round(weight_bytes / (args.bandwidth_gbs * 1e9) * 1e6, 2)}

            def cublas(ws=w_onnx):
                for wi in ws:
                    torch.matmul(x, wi, out=y_ref)

            row["cublas_us"] = round(_time_graph(torch, cublas, args.replays) / layers * 1e6, 2)
            # the reference the custom results are checked against: FP32 products of the same halves
            ref = x.float() @ w[0].float().t()
            if kind == "swiglu":
                g, u = ref[:, 0::2].half().float(), ref[:, 1::2].half().float()
                ref = (g * torch.sigmoid(g)).half().float() * u
            best = None
            for (kname, per_warp), ks in ((v, ks) for v in VARIANTS[kind] for ks in SPLITS):
                fname = f"{kname}_m{m}_ks{ks}"
                grid = grid_for(n, ks, per_warp)

                def custom(fname=fname, grid=grid, ws=w):
                    st = torch.cuda.current_stream().cuda_stream
                    for wi in ws:
                        mod.launch(fname, grid, x.data_ptr(), wi.data_ptr(), y.data_ptr(), n, k, st)

                y.zero_()
                mod.launch(fname, grid, x.data_ptr(), w[0].data_ptr(), y.data_ptr(), n, k,
                           torch.cuda.current_stream().cuda_stream)
                torch.cuda.synchronize()
                err = float((y.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
                us = round(_time_graph(torch, custom, args.replays) / layers * 1e6, 2)
                row[f"{kname}_ks{ks}_us"], row[f"{kname}_ks{ks}_max_rel_err"] = us, round(err, 6)
                if err < 2e-2 and (best is None or us < row[f"{best}_us"]):
                    best = f"{kname}_ks{ks}"
            row["best"] = best
            row["custom_us"] = row[f"{best}_us"] if best else None
            row["speedup"] = round(row["cublas_us"] / row["custom_us"], 3) if best else None
            out["ops"][f"{name}_m{m}"] = row
            print(f"{name:8s} M={m}  n={n:6d} k={k:5d}  floor {row['byte_floor_us']:7.2f} us  cuBLAS "
                  f"{row['cublas_us']:7.2f} us  custom {row['custom_us']} us ({best})  "
                  f"x{row['speedup']}", flush=True)
        del w, w_onnx
        torch.cuda.empty_cache()
    for m in ([] if args.only == "attention" else args.slots):
        ops = out["ops"]
        # today: q|k|v, o, gate, up (the same shape as gate), SiLU and Mul (two elementwise kernels), down
        g = torch.randn(m, 3584, device=dev, dtype=torch.float16)
        u, act = torch.randn_like(g), torch.empty_like(g)

        def silu_mul():
            for _ in range(LAYERS):
                torch.nn.functional.silu(g, inplace=True)
                torch.mul(g, u, out=act)

        ops[f"silu_mul_m{m}"] = {"cublas_us": round(_time_graph(torch, silu_mul, args.replays) / LAYERS * 1e6, 2)}
        cub = sum(ops[f"{o}_m{m}"]["cublas_us"] for o in ("qkv", "o", "gate", "gate", "silu_mul", "down"))
        cus = [ops[f"{o}_m{m}"]["custom_us"] for o in ("qkv", "o", "gate_up", "down")]
        if None in cus:
            continue
        out[f"layer_m{m}"] = {"cublas_us": round(cub, 2), "custom_us": round(sum(cus), 2),
                              "step_saving_ms": round((cub - sum(cus)) * LAYERS / 1e3, 3)}
        print(f"per layer, M={m}: cuBLAS {cub:.2f} us (q|k|v, o, gate, up, SiLU, Mul, down)  custom {sum(cus):.2f} us "
              f"(q|k|v, o, SwiGLU, down): {(cub - sum(cus)) * LAYERS / 1e3:.3f} ms less per step", flush=True)
    for m in args.slots:
        for c in args.chunks:
            out["ops"][f"attention_m{m}_chunk{c}"] = bench_attention(torch, attn[c], m, args, c)
    return out


def bench_attention(torch, attn: Module, slots: int, args, chunk: int = CHUNK) -> dict:
    """The custom attention kernel (cache rows per block: `chunk`) against SDPA over the same cache rows, 24
    distinct caches."""
    dev, depth = torch.device("cuda"), args.depth
    assert CACHE_LEN % chunk == 0 and 1 <= depth <= CACHE_LEN, (CACHE_LEN, chunk, depth)
    n_splits, scale = CACHE_LEN // chunk, HEAD_DIM ** -0.5
    gen = torch.Generator(device=dev).manual_seed(1)
    shape = (slots, KV_HEADS, CACHE_LEN, HEAD_DIM)
    ks = [torch.randn(shape, device=dev, generator=gen, dtype=torch.float16) for _ in range(LAYERS)]
    vs = [torch.randn(shape, device=dev, generator=gen, dtype=torch.float16) for _ in range(LAYERS)]
    q = torch.randn(slots, Q_HEADS, HEAD_DIM, device=dev, generator=gen, dtype=torch.float16)
    lens = torch.full((slots,), depth, device=dev, dtype=torch.int32)
    part_o = torch.empty(slots, Q_HEADS, n_splits, HEAD_DIM, device=dev, dtype=torch.float32)
    part_ml = torch.empty(slots, Q_HEADS, n_splits, 2, device=dev, dtype=torch.float32)
    o = torch.empty(slots, Q_HEADS, HEAD_DIM, device=dev, dtype=torch.float16)
    count = torch.zeros(slots, KV_HEADS, device=dev, dtype=torch.int32)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def run_one(k, v, stream):
        attn.launch_args("attn_decode", (KV_HEADS, n_splits, slots), 128, stream,
                         [ctypes.c_void_p(q.data_ptr()), ctypes.c_void_p(k.data_ptr()), ctypes.c_void_p(v.data_ptr()),
                          ctypes.c_void_p(lens.data_ptr()), ctypes.c_void_p(part_o.data_ptr()),
                          ctypes.c_void_p(part_ml.data_ptr()), ctypes.c_void_p(count.data_ptr()),
                          ctypes.c_void_p(o.data_ptr()), ctypes.c_float(scale), ctypes.c_int(CACHE_LEN),
                          ctypes.c_int(n_splits), ctypes.c_int(0)])

    def one_kernel():
        st = torch.cuda.current_stream().cuda_stream
        for k, v in zip(ks, vs):
            run_one(k, v, st)

    from torch.nn.attention import SDPBackend, sdpa_kernel

    def torch_sdpa():
        for k, v in zip(ks, vs):
            sdpa(q[:, :, None], k[:, :, :depth], v[:, :, :depth], scale=scale, enable_gqa=True)

    kf = ks[0][:, :, :depth].float().repeat_interleave(Q_HEADS // KV_HEADS, dim=1)
    vf = vs[0][:, :, :depth].float().repeat_interleave(Q_HEADS // KV_HEADS, dim=1)
    p = torch.softmax((q.float()[:, :, None] @ kf.transpose(-1, -2)) * scale, dim=-1)
    ref = (p @ vf)[:, :, 0]
    o.zero_()
    run_one(ks[0], vs[0], torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    err = float((o.float() - ref).abs().max() / ref.abs().max())
    row = {"slots": slots, "depth": depth, "cache_len": CACHE_LEN, "max_rel_err": round(err, 6),
           "correct": err < 2e-2,
           "byte_floor_us": round(2 * slots * KV_HEADS * depth * HEAD_DIM * 2 / (args.bandwidth_gbs * 1e9) * 1e6, 2),
           "custom_us": round(_time_graph(torch, one_kernel, args.replays) / LAYERS * 1e6, 2)}
    # the kernel at other depths, each slot at its own (one block, a block's edge, a partial last block, the
    # whole cache), twice in a row (the counters must be back at 0 for the second)
    worst = 0.0
    for d0 in (1, 40, 64, 65, 1093, CACHE_LEN):
        dl = [max(1, min(CACHE_LEN, d0 - 37 * i)) for i in range(slots)]
        lens.copy_(torch.tensor(dl, dtype=torch.int32))
        for _ in range(2):
            o.zero_()
            run_one(ks[1], vs[1], torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        for i, di in enumerate(dl):
            kf = ks[1][i, :, :di].float().repeat_interleave(Q_HEADS // KV_HEADS, dim=0)
            vf = vs[1][i, :, :di].float().repeat_interleave(Q_HEADS // KV_HEADS, dim=0)
            p = torch.softmax((q[i].float()[:, None] @ kf.transpose(-1, -2)) * scale, dim=-1)
            r = (p @ vf)[:, 0]
            worst = max(worst, float((o[i].float() - r).abs().max() / r.abs().max()))
    lens.fill_(depth)
    row["depths_max_rel_err"] = round(worst, 6)
    row["count_left"] = int(count.abs().sum())                  # every (slot, head) counter back at 0
    row["correct"] = row["correct"] and worst < 2e-2 and row["count_left"] == 0
    # SDPA on each of its fused backends that takes this call (the math fallback would copy k/v per group)
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        def pinned(backend=backend):
            with sdpa_kernel(backend):
                torch_sdpa()
        try:
            row[f"sdpa_{name}_us"] = round(_time_graph(torch, pinned, args.replays) / LAYERS * 1e6, 2)
        except Exception as e:                        # not available for this call, or not capturable: say so
            row[f"sdpa_{name}_error"] = f"{type(e).__name__}: {e}"[:200]
    sdpa_best = min((v for k_, v in row.items() if k_.startswith("sdpa_") and k_.endswith("_us")), default=None)
    row["sdpa_us"] = sdpa_best
    row["chunk"] = chunk
    print(f"attention M={slots} chunk {chunk} depth {depth}: floor {row['byte_floor_us']} us  "
          f"custom {row['custom_us']} us "
          f"(max rel err {err:.2g}, other depths {worst:.2g}, counters left {row['count_left']}"
          f"{'' if row['correct'] else ', WRONG'})  best fused SDPA {sdpa_best} us", flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 8], choices=SLOTS)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--bandwidth-gbs", type=float, default=4800.0, help="memory bandwidth for the byte floor")
    ap.add_argument("--depth", type=int, default=1221, help="attention: cache rows filled (<= 4,096)")
    ap.add_argument("--chunks", type=int, nargs="+", default=[16, 32, 64], help="attention: cache rows per block")
    ap.add_argument("--only", choices=["attention"], help="only the attention kernels")
    ap.add_argument("--compile-only", nargs="*", metavar="ARCH", help="only compile for these architectures")
    args = ap.parse_args(argv)
    if args.compile_only is not None:
        for arch in args.compile_only or ["sm_90"]:
            t = time.perf_counter()
            cubin = compile_cubin(GEMV_SOURCE, arch, "decode_gemvs.cu", {"TENSOR_CORES": 1})
            cubin_attn = compile_cubin(ATTENTION.read_text(), arch, ATTENTION.name)
            missing = [n for n in kernel_names() if n.encode() not in cubin]
            missing += [n for n in ATTN_KERNELS if n.encode() not in cubin_attn]
            if missing:
                raise SystemExit(f"{arch}: kernels missing from the cubin: {missing}")
            print(f"{arch}: {len(kernel_names()) + len(ATTN_KERNELS)} kernels, cubins "
                  f"{(len(cubin) + len(cubin_attn)) / 1024:.0f} KiB, {time.perf_counter() - t:.1f} s")
        return 0
    out = bench(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
