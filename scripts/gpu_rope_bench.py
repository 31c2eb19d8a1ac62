"""The prefill's XD-RoPE as ONNX Runtime CUDA ops, formulation by formulation (docs/perf.md section 25).

The CUDA fusion (`quantize fuse --target cuda`: `pack_gqa_qk_norm`, then `fuse_rope`) computes a layer's RoPE on the
packed q|k|v projection x [1, S, H, D] (H = 16 query + 8 key + 8 value heads, D = 128) as one broadcast Mul by a
[cos | sin'] table [1, S, H, 2, D] (the value heads' rows cos 1, sin 0) and one MatMul by [I; R] (R = rotate_half as a
matrix).  Layout B's table (transformers >= 5.13) pairs dims d and d + D/2 with different angles, so ONNX Runtime's
RotaryEmbedding op cannot hold it.  This script times other ONNX formulations of the same product, each as `--nodes`
copies in one graph replayed as a CUDA graph (microseconds a copy), and checks each against numpy.  Every copy reads
tables of its own, as each prefill layer finds its table evicted from the L2 cache by that layer's weights (copies
sharing one table and one input would also be merged into one by ONNX Runtime's common-subexpression pass, which is
turned off here):

  current      Mul(x[.., 1, D], [cos|sin'] [.., H, 2, D]) -> Reshape -> MatMul([I; R])     (what the fusion writes)
  two_muls     Mul(x, cos) ; Mul(x, sin') ; MatMul(., R) ; Add                            (no broadcast)
  gemm_c       Mul(x, cos) ; Mul(x, sin') ; Gemm(., R, C = x*cos)                         (the Add in the GEMM)
  grouped      x as [.., H/8, 8, 1, D] times a table [.., H/8, 1, 2, D]: one row per group of 8 heads (the value
               heads are one group), 8x smaller; both operands broadcast
  rot_grouped  MatMul(x, [I | R]) -> Mul(., [cos | sin] of one row per group of 8 heads) -> MatMul(., [I; I])

    python scripts/gpu_rope_bench.py [--tokens 1093] [--nodes 24] [--repeats 50] [--forms a,b] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_matmul_nbits_bench import replay  # noqa: E402

FORMS = ("current", "two_muls", "gemm_c", "grouped", "rot_grouped")
GROUP = 8                                  # heads per table row in the grouped forms: gcd(16 query, 8 key/value)


def rotate_half_matrix(d: int) -> np.ndarray:
    """R with x @ R == rotate_half(x) = cat(-x[d/2:], x[:d/2])."""
    r, h = np.zeros((d, d), np.float32), d // 2
    r[np.arange(h) + h, np.arange(h)] = -1.0
    r[np.arange(h), np.arange(h) + h] = 1.0
    return r


def tables(s: int, heads: int, rotated: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Layout-B-like cos/sin [S, H, D]: every dim its own angle; heads >= `rotated` cos 1, sin 0."""
    rng = np.random.default_rng(seed)
    ang = rng.uniform(-np.pi, np.pi, (s, 1, d)).astype(np.float32)
    cos = np.broadcast_to(np.cos(ang), (s, heads, d)).copy()
    sin = np.broadcast_to(np.sin(ang), (s, heads, d)).copy()
    cos[:, rotated:], sin[:, rotated:] = 1.0, 0.0
    return cos, sin


def reference(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    xf = x.astype(np.float32)
    return xf * cos + (xf @ rotate_half_matrix(x.shape[-1])) * sin


def _model(form: str, s: int, heads: int, d: int, nodes: int, cos: np.ndarray, sin: np.ndarray):
    from onnx import TensorProto, helper, numpy_helper

    r = rotate_half_matrix(d)
    sinp = sin[..., np.argmax(r != 0, axis=1)]       # (x * sin') @ R == (x @ R) * sin
    f16, g, G = np.float16, GROUP, heads // GROUP
    table = np.stack([cos, sinp], axis=-2)[None].astype(f16)                             # [1, S, H, 2, D]
    inits = {
        "stack": np.concatenate([np.eye(d, dtype=np.float32), r]).astype(f16),           # [2D, D]
        "rmat": r.astype(f16), "rowcat": np.concatenate([np.eye(d, dtype=np.float32), r], axis=1).astype(f16),
        "sumhalves": np.concatenate([np.eye(d), np.eye(d)]).astype(f16),                # [2D, D]
        "ax": np.array([-2], np.int64), "pairs": np.array([0, 0, 0, -1], np.int64),
        "flat2": np.array([-1, d], np.int64), "shape4": np.array([1, s, heads, d], np.int64),
        "gshape": np.array([1, s, G, g, 1, d], np.int64), "gpairs": np.array([1, s, G, g, 2 * d], np.int64),
        "g2shape": np.array([1, s, G, g, 2 * d], np.int64), "h2shape": np.array([1, s, heads, 2 * d], np.int64),
    }
    nodes_out, outs = [], []
    for i in range(nodes):
        t, y = f"n{i}", f"y{i}"
        if form == "current":
            inits[t + "table"] = table
            nodes_out += [helper.make_node("Unsqueeze", ["x", "ax"], [t + "x5"]),
                          helper.make_node("Mul", [t + "x5", t + "table"], [t + "p"]),
                          helper.make_node("Reshape", [t + "p", "pairs"], [t + "p4"]),
                          helper.make_node("MatMul", [t + "p4", "stack"], [y])]
        elif form in ("two_muls", "gemm_c"):
            inits[t + "cos"], inits[t + "sinp"] = cos[None].astype(f16), sinp[None].astype(f16)
            nodes_out += [helper.make_node("Mul", ["x", t + "cos"], [t + "a"]),
                          helper.make_node("Mul", ["x", t + "sinp"], [t + "b"])]
            if form == "two_muls":
                nodes_out += [helper.make_node("MatMul", [t + "b", "rmat"], [t + "br"]),
                              helper.make_node("Add", [t + "a", t + "br"], [y])]
            else:
                nodes_out += [helper.make_node("Reshape", [t + "a", "flat2"], [t + "a2"]),
                              helper.make_node("Reshape", [t + "b", "flat2"], [t + "b2"]),
                              helper.make_node("Gemm", [t + "b2", "rmat", t + "a2"], [t + "y2"]),
                              helper.make_node("Reshape", [t + "y2", "shape4"], [y])]
        elif form == "grouped":
            inits[t + "gtable"] = table[:, :, ::g][:, :, :, None].copy()                    # [1, S, H/g, 1, 2, D]
            nodes_out += [helper.make_node("Reshape", ["x", "gshape"], [t + "x6"]),
                          helper.make_node("Mul", [t + "x6", t + "gtable"], [t + "p"]),
                          helper.make_node("Reshape", [t + "p", "gpairs"], [t + "p5"]),
                          helper.make_node("MatMul", [t + "p5", "stack"], [t + "y5"]),
                          helper.make_node("Reshape", [t + "y5", "shape4"], [y])]
        elif form == "rot_grouped":
            cossin = np.concatenate([cos, sin], axis=-1)[None].astype(f16)                  # [1, S, H, 2D]
            inits[t + "gcs"] = cossin[:, :, ::g][:, :, :, None].copy()                       # [1, S, H/g, 1, 2D]
            nodes_out += [helper.make_node("MatMul", ["x", "rowcat"], [t + "xr"]),
                          helper.make_node("Reshape", [t + "xr", "g2shape"], [t + "xr5"]),
                          helper.make_node("Mul", [t + "xr5", t + "gcs"], [t + "p5"]),
                          helper.make_node("Reshape", [t + "p5", "h2shape"], [t + "p"]),
                          helper.make_node("MatMul", [t + "p", "sumhalves"], [y])]
        else:
            raise ValueError(f"unknown form {form!r}; expected one of {FORMS}")
        outs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT16, [1, s, heads, d]))
    used = {i for n in nodes_out for i in n.input}
    graph = helper.make_graph(nodes_out, f"rope_{form}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, s, heads, d])], outs,
                              [numpy_helper.from_array(v, k) for k, v in inits.items() if k in used])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8                # what every ONNX Runtime since 1.10 reads
    return model


def session(form: str, s: int, heads: int, d: int, nodes: int, cos, sin, providers):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(_model(form, s, heads, d, nodes, cos, sin).SerializeToString(), so,
                                providers=providers, disabled_optimizers=["CommonSubexpressionElimination"])


def run_one(form: str, s: int, nodes: int, repeats: int, heads: int = 32, rotated: int = 24, d: int = 128) -> dict:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, s, heads, d)).astype(np.float16)
    cos, sin = tables(s, heads, rotated, d, seed=1)
    sess = session(form, s, heads, d, nodes, cos, sin, [("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
    ms, ys = replay(sess, x, [1, s, heads, d], nodes, repeats)
    err = max(float(np.abs(y.numpy().astype(np.float32) - reference(x[0], cos, sin)[None]).max()) for y in ys[:2])
    return {"form": form, "tokens": s, "nodes": nodes, "us_per_node": round(ms * 1e3 / nodes, 2),
            "graph_ms": round(ms, 4), "max_abs_err": err, "ok": err < 0.02}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1093)
    ap.add_argument("--nodes", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows = []
    for form in args.forms.split(","):
        row = run_one(form, args.tokens, args.nodes, args.repeats)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
