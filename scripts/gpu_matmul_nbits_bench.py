"""The 8-bit weight GEMMs of a page's admission on ONNX Runtime CUDA, one shape at a time: FP16 MatMul beside
MatMulNBits in each of the forms ONNX Runtime 1.31 offers for 8-bit weights.

    python scripts/gpu_matmul_nbits_bench.py [--json OUT.json] [--nodes 8] [--repeats 40] [--only vision|prefill]

Forms (each in its own process, so that the ONNX Runtime option that picks the path is scoped to it):
  fp16      MatMul over FP16 weights: the floor an 8-bit form has to beat once it has to dequantize
  b32       MatMulNBits, 8 bits, blocks of 32: what `quantize native-step` writes; ONNX Runtime dequantizes the
            weight into a scratch buffer and runs cuBLAS (one Dequantize8BitsKernel + one GEMM per node)
  fpa32     the same graph with ONNX Runtime's fpA_intB path on (`ep.cuda.fpa_intb_gemm` and ORT_FPA_INTB_GEMM):
            CUTLASS GEMMs that read the 8-bit weight (prepacked at load, SM80 layout), for N a multiple of 32
  sm90b64   weights prepacked offline for the native Hopper kernel (weight_prepacked=2, blocks of 64; TMA/WGMMA)
  sm90b128  the same, blocks of 128
Shapes are [M rows, N outputs, K inputs]: the vision encoder's per-layer GEMMs over its 4,096 patches (q, k, v and
the output projection 1,152 x 1,152; the MLP 4,304 wide, and padded to 4,352 so that every block form accepts it)
and the decoder prefill's over 1,093 tokens.  Each graph runs `--nodes` independent nodes of one shape (their own
weights, the same input), replayed as one CUDA graph; the time per node is the median replay over the node count.
Every form's first output is checked against the FP16 product of the weights it was given (relative error).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

VISION = [(4096, 1152, 1152), (4096, 4304, 1152), (4096, 1152, 4304), (4096, 4352, 1152), (4096, 1152, 4352)]
PREFILL = [(1093, 4096, 1024), (1093, 1024, 2048), (1093, 3584, 1024), (1093, 1024, 3584)]
FORMS = ("fp16", "b32", "fpa32", "sm90b64", "sm90b128")


def q8_blocks(w_nk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W [N, K] as MatMulNBits' 8-bit blocks of 32: (B [N, blocks, 32] uint8, scales [N, blocks] fp16)."""
    import torch
    from onnxruntime.quantization.cuda_quantizer import CudaQuantizer

    b, s = CudaQuantizer.matmulnbits_blockwise_quantize(torch.from_numpy(w_nk.astype(np.float32)), 8, 32,
                                                        flatten_qweight=False)
    return b.numpy(), s.numpy().astype(np.float16)


def replay(sess, x: np.ndarray, out_shape: list[int], outputs: int, repeats: int):
    """The session's graph bound to `x` and `outputs` outputs y0.. of `out_shape` (FP16) on the GPU, replayed (a CUDA
    graph after its first runs): (median ms of `repeats` replays after 5, the output OrtValues)."""
    import onnxruntime as ort

    xv = ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
    ys = [ort.OrtValue.ortvalue_from_shape_and_type(out_shape, np.float16, "cuda", 0) for _ in range(outputs)]
    b = sess.io_binding()
    b.bind_ortvalue_input("x", xv)
    for i, y in enumerate(ys):
        b.bind_ortvalue_output(f"y{i}", y)
    for _ in range(5):
        sess.run_with_iobinding(b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sess.run_with_iobinding(b)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), ys


def _quantized(w_nk: np.ndarray, form: str):
    """(B [N, blocks, block bytes] uint8, scales [N, blocks] fp16, block, weight_prepacked) for MatMulNBits, or None
    where the form cannot hold this shape."""
    import torch
    from onnxruntime.quantization.cuda_quantizer import CudaQuantizer

    n, k = w_nk.shape
    if form in ("b32", "fpa32"):
        return *q8_blocks(w_nk), 32, 0
    block = 64 if form == "sm90b64" else 128
    if k % block or n % 32:
        return None
    w = torch.from_numpy(w_nk.astype(np.float32))
    b, s = CudaQuantizer.matmulnbits_prepacked_blockwise_quantize(w, 8, block, force_arch=90)
    return b.numpy(), s.numpy().astype(np.float16), block, 2


def _model(m: int, n: int, k: int, form: str, nodes: int, seed: int):
    """The graph and the dequantized FP16 weights [K, N] of its first node (for the check), or None."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, ns, outs, first = [], [], [], None
    for i in range(nodes):
        w_nk = (rng.standard_normal((n, k)) * (1.0 / np.sqrt(k))).astype(np.float16)
        if form == "fp16":
            inits.append(numpy_helper.from_array(np.ascontiguousarray(w_nk.T), f"w{i}"))
            ns.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]))
            ref = w_nk.T.astype(np.float32)
        else:
            q = _quantized(w_nk, form)
            if q is None:
                return None
            b, s, block, prepacked = q
            if form in ("b32", "fpa32"):    # the reference: the weights as the 8-bit blocks hold them
                nb = b.shape[1]
                deq = (b.astype(np.float32) - 128.0) * s.astype(np.float32)[:, :, None]
                ref = deq.reshape(n, nb * block)[:, :k].T
            else:
                ref = w_nk.T.astype(np.float32)  # prepacked bytes are not plain blocks: checked against W itself
            inits += [numpy_helper.from_array(b, f"b{i}"), numpy_helper.from_array(s, f"s{i}")]
            attrs = dict(K=k, N=n, bits=8, block_size=block)
            if prepacked:
                attrs["weight_prepacked"] = prepacked
            ns.append(helper.make_node("MatMulNBits", ["x", f"b{i}", f"s{i}"], [f"y{i}"], domain="com.microsoft",
                                       **attrs))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT16, [m, n]))
        if i == 0:
            first = ref
    g = helper.make_graph(ns, "gemms", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [m, k])], outs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    return model, first


def run_one(m: int, n: int, k: int, form: str, nodes: int, repeats: int) -> dict:
    import onnxruntime as ort

    built = _model(m, n, k, form, nodes, seed=m * 7 + n * 3 + k)
    if built is None:
        return {"form": form, "shape": [m, n, k], "skipped": "this form cannot hold the shape"}
    model, ref = built
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.onnx")
        import onnx
        onnx.save(model, path)
        so = ort.SessionOptions()
        if form == "fpa32":
            so.add_session_config_entry("ep.cuda.fpa_intb_gemm", "1")
        t0 = time.perf_counter()
        sess = ort.InferenceSession(path, so, providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
        load_s = time.perf_counter() - t0
    x = (np.random.default_rng(1).standard_normal((m, k)) * 0.5).astype(np.float16)
    med, ys = replay(sess, x, [m, n], nodes, repeats)
    got = ys[0].numpy().astype(np.float32)
    want = x.astype(np.float32) @ ref
    rel = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-9))
    return {"form": form, "shape": [m, n, k], "nodes": nodes, "replay_ms": round(med, 4),
            "per_node_us": round(med / nodes * 1e3, 2), "tflops": round(2 * m * n * k * nodes / (med * 1e-3) / 1e12, 1),
            "rel_err": rel, "load_s": round(load_s, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--only", choices=("vision", "prefill"))
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--one", help=argparse.SUPPRESS)        # M,N,K,form: one case in this process
    a = ap.parse_args(argv)
    if a.one:
        m, n, k, form = a.one.split(",")
        print(json.dumps(run_one(int(m), int(n), int(k), form, a.nodes, a.repeats)))
        return 0
    shapes = {"vision": VISION, "prefill": PREFILL}.get(a.only, VISION + PREFILL)
    results = []
    for m, n, k in shapes:
        for form in a.forms.split(","):
            env = dict(os.environ, ORT_FPA_INTB_GEMM="1" if form == "fpa32" else "0")
            p = subprocess.run([sys.executable, __file__, "--one", f"{m},{n},{k},{form}", "--nodes", str(a.nodes),
                                "--repeats", str(a.repeats)], env=env, capture_output=True, text=True, timeout=600)
            line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
            r = json.loads(line) if p.returncode == 0 and line.startswith("{") else {
                "form": form, "shape": [m, n, k], "error": (p.stderr.strip().splitlines() or ["?"])[-1][:400]}
            results.append(r)
            print(f"{m:5d} x {n:5d} x {k:5d}  {form:9s} " + (
                f"{r['per_node_us']:8.1f} us/node  {r['tflops']:6.1f} TFLOP/s  rel err {r['rel_err']:.2e}"
                if "per_node_us" in r else r.get("skipped") or "ERROR " + r["error"]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
