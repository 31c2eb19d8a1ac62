"""The vision encoder's attention block on ONNX Runtime CUDA in the two layouts its q, k and v can reach
MultiHeadAttention in: three projections (`quantize native-step --vision-qkv three`: three MatMul[NBits], q, k and
v bias-added and transposed by three kernels) against one packed projection whose columns are in [head, q|k|v, dim]
order, read by MultiHeadAttention as its packed-QKV input [B, S, N, 3, H] with the same bias (`--vision-qkv packed`).

    python scripts/gpu_vision_qkv_bench.py [--json OUT.json] [--blocks 4] [--repeats 30]

Real vision sizes: 4,096 patches, 1,152 wide, 16 heads of 72.  Weights as FP16 MatMul and as 8-bit MatMulNBits in
blocks of 32 (the 8-bit artifact's vision).  Each graph runs `--blocks` independent attention blocks (own weights,
same input), replayed as one CUDA graph; time per block is the median replay over the block count.  The packed
layout's output is checked against the three-projection one built from the same weights.
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

from gpu_matmul_nbits_bench import q8_blocks, replay    # the script's folder is on sys.path when it runs

S, C, HEADS = 4096, 1152, 16
D = C // HEADS


def _proj(inits, nodes, x: str, w_kn: np.ndarray, name: str, out: str, weights: str) -> None:
    from onnx import helper, numpy_helper

    k, n = w_kn.shape
    if weights == "fp16":
        inits.append(numpy_helper.from_array(np.ascontiguousarray(w_kn.astype(np.float16)), name))
        nodes.append(helper.make_node("MatMul", [x, name], [out]))
    else:
        b, s = q8_blocks(np.ascontiguousarray(w_kn.T))
        inits += [numpy_helper.from_array(b, name + "_b"), numpy_helper.from_array(s, name + "_s")]
        nodes.append(helper.make_node("MatMulNBits", [x, name + "_b", name + "_s"], [out], domain="com.microsoft",
                                      K=k, N=n, bits=8, block_size=32))


def build(layout: str, weights: str, blocks: int, seed: int = 0):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, nodes, outs = [], [], []
    for i in range(blocks):
        w = (rng.standard_normal((C, 3 * C)) / np.sqrt(C)).astype(np.float16)     # [K, q|k|v], as exported
        bias = (rng.standard_normal(3 * C) * 0.1).astype(np.float16)
        inits.append(numpy_helper.from_array(bias, f"bias{i}"))
        if layout == "three":
            for j, part in enumerate("qkv"):
                _proj(inits, nodes, "x", w[:, j * C:(j + 1) * C], f"w{i}{part}", f"{part}{i}", weights)
            ins = [f"q{i}", f"k{i}", f"v{i}", f"bias{i}"]
        else:       # columns [q|k|v, head, dim] -> [head, q|k|v, dim]: MultiHeadAttention's packed [B, S, N, 3, H]
            perm = np.arange(3 * C).reshape(3, HEADS, D).transpose(1, 0, 2).reshape(-1)
            _proj(inits, nodes, "x", w[:, perm], f"w{i}", f"qkv{i}", weights)
            inits.append(numpy_helper.from_array(np.array([1, S, HEADS, 3, D], np.int64), f"shape{i}"))
            nodes.append(helper.make_node("Reshape", [f"qkv{i}", f"shape{i}"], [f"packed{i}"]))
            ins = [f"packed{i}", "", "", f"bias{i}"]
        nodes.append(helper.make_node("MultiHeadAttention", ins, [f"y{i}"], domain="com.microsoft", num_heads=HEADS))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT16, [1, S, C]))
    g = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, S, C])], outs,
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    return m


def run(layout: str, weights: str, blocks: int, repeats: int, x: np.ndarray) -> tuple[dict, np.ndarray]:
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.onnx")
        onnx.save(build(layout, weights, blocks), p)
        sess = ort.InferenceSession(p, providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
    med, ys = replay(sess, x, [1, S, C], blocks, repeats)
    return {"layout": layout, "weights": weights, "blocks": blocks, "replay_ms": round(med, 4),
            "per_block_us": round(med / blocks * 1e3, 2)}, ys[0].numpy()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args(argv)
    x = (np.random.default_rng(1).standard_normal((1, S, C)) * 0.5).astype(np.float16)
    results = []
    for weights in ("fp16", "int8"):
        outs = {}
        for layout in ("three", "packed", "three", "packed"):       # twice, alternating
            r, y = run(layout, weights, a.blocks, a.repeats, x)
            outs[layout] = y.astype(np.float32)
            results.append(r)
            print(f"{weights:5s} {layout:7s} {r['per_block_us']:8.1f} us per attention block", flush=True)
        diff = float(np.abs(outs["three"] - outs["packed"]).max())
        results.append({"weights": weights, "max_abs_diff_packed_vs_three": diff})
        print(f"{weights:5s} packed vs three: max |diff| {diff:.3e}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
