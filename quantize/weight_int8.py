"""Weight-only INT8 for ONNX Runtime: the decoder's MatMul weights as 8-bit blocks (MatMulNBits).

    python -m quantize weight-int8 ARTIFACT OUT [--block-size 32]

Decoding one token reads every decoder weight once and does little arithmetic with it, so on a GPU its
speed is set by weight bytes, not by the arithmetic's precision.  The calibrated INT8 artifact
(`python -m quantize int8`: explicit Q/DQ on weights *and* activations) is made for TensorRT,
which fuses Q/DQ into INT8 kernels; ONNX Runtime's CUDA provider runs those Q/DQ pairs as separate
dequantize kernels, so it decodes slower than FP16 there.  This flavour keeps the activations in the
artifact's own precision (FP16 for GPUs) and stores each MatMul weight as symmetric 8-bit integers with
one scale per `block_size` inputs: ONNX Runtime's MatMulNBits kernels read half the bytes of FP16.
No calibration data is needed (round-to-nearest per block).  The vision graph's MatMul weights (0.41 B
parameters, 0.8 GB in FP16) are stored the same way by default: the vision encoder is bound by arithmetic over
4,096 patches rather than by weight bytes, so this is for device memory (ONNX Runtime dequantizes each block of
weights inside its kernels); `vision=False` keeps it as it is.  Fuse first (`python -m quantize.fuse`): the
fusions match MatMul + bias patterns that MatMulNBits replaces.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from edgeocr import artifact as af

log = logging.getLogger("quantize")

PRECISION = "int8-weights"


def weight_first_matmuls(model) -> list[str]:
    """Rewrite MatMul(W, Transpose(x)) with W a 2-D initializer [N, K] -- how the export computes the tied
    lm_head, sharing the embedding table -- as Transpose(MatMul(x, W_t)) with W_t = W.T [K, N] stored, so
    the weight is MatMul's second, constant operand that MatMulNBits quantizes; a fused graph's
    Gemm(x, W, transB=1) becomes MatMul(x, W_t) likewise.  W stays for the embedding lookup.  Returns the
    weights rewritten."""
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    users: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            users[i] = users.get(i, 0) + 1
    nodes, done = [], []
    for n in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        w = inits.get(n.input[1]) if n.op_type == "Gemm" and len(n.input) == 2 else None
        if w is not None and len(w.dims) == 2 and attrs.get("transB") == 1 and not attrs.get("transA") \
                and attrs.get("alpha", 1.0) == 1.0:
            wt = numpy_helper.from_array(numpy_helper.to_array(w).T.copy(), w.name + "_t")
            model.graph.initializer.append(wt)
            nodes.append(helper.make_node("MatMul", [n.input[0], wt.name], list(n.output), name=n.name + "_weight_second"))
            done.append(w.name)
            continue
        t = producers.get(n.input[1]) if n.op_type == "MatMul" else None
        w = inits.get(n.input[0]) if t is not None else None
        perm = [list(a.ints) for a in t.attribute if a.name == "perm"] if t is not None else []
        if w is None or len(w.dims) != 2 or t.op_type != "Transpose" or perm not in ([[1, 0]], []):
            nodes.append(n)
            continue
        wt = numpy_helper.from_array(numpy_helper.to_array(w).T.copy(), w.name + "_t")
        model.graph.initializer.append(wt)
        mid = n.output[0] + "_weight_second"
        nodes.append(helper.make_node("MatMul", [t.input[0], wt.name], [mid], name=n.name + "_weight_second"))
        nodes.append(helper.make_node("Transpose", [mid], [n.output[0]], perm=[1, 0], name=n.name + "_back"))
        done.append(w.name)
        if users.get(t.output[0], 0) == 1:
            nodes.remove(t)                      # it came earlier (topological order)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return done


def quantize_matmuls(model, block_size: int, keep: list[str] = ()):
    """Every MatMul with a constant 2-D weight (except the `keep` node names) -> MatMulNBits, 8 bits, symmetric
    blocks of `block_size` inputs.  Returns (quantized ModelProto, MatMuls quantized, MatMuls eligible)."""
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as e:
        raise ValueError(f"weight-only INT8 needs ONNX Runtime's quantization tools ({e}): "
                         "pip install 'edgeocr[int8]'") from None

    inits = {i.name for i in model.graph.initializer}
    eligible = sum(1 for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits and n.name not in keep)
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)  # a line per node
    q = MatMulNBitsQuantizer(model, bits=8, block_size=block_size, is_symmetric=True, nodes_to_exclude=list(keep),
                             op_types_to_quantize=("MatMul",))
    q.process()
    qm = q.model.model
    return qm, sum(1 for n in qm.graph.node if n.op_type == "MatMulNBits"), eligible


def build_weight_int8(src_artifact: Path, out: Path, block_size: int = 32, lm_head: bool = False,
                      vision: bool = True, progress: Callable[[str], None] | None = None) -> af.Artifact:
    """FP16 (or FP32) artifact -> the same artifact with the MatMul weights in 8-bit blocks: the decoder's and,
    with `vision` (default), the vision encoder's.

    The (tied) lm_head stays as it is unless `lm_head`: ONNX Runtime 1.31's CUDA MatMulNBits has no
    one-row kernel for its shape (vocabulary-wide output) and dequantizes the whole matrix every step
    (measured on the H200: 0.13 ms a step, more than its FP16 GEMV), and keeping it shares the FP16
    embedding table instead of storing a second, INT8 copy."""
    import onnx

    from quantize.export import _file_table, _io
    from quantize.fuse import save_graph

    say = progress or (lambda s: log.info("%s", s))
    t0 = time.perf_counter()
    src_artifact, out = Path(src_artifact), Path(out)
    src = af.read(src_artifact)
    if src.precision not in ("fp16", "fp32"):
        raise ValueError(f"{src_artifact} is {src.precision}; weight-only INT8 starts from an FP16 or FP32 artifact")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block size {block_size}: must be a power of two >= 16 (MatMulNBits)")
    if out.resolve() == src_artifact.resolve():
        raise ValueError("OUT must differ from ARTIFACT")
    out.mkdir(parents=True, exist_ok=True)
    info = {"op": "com.microsoft.MatMulNBits", "bits": 8, "block_size": block_size, "symmetric": True,
            "activations": src.precision, "lm_head": lm_head, "graphs": {}}
    written = set()
    for graph in ("decoder", "vision") if vision else ("decoder",):
        g = getattr(src, graph).file
        model = onnx.load(str(src_artifact / g))          # external data loaded from beside it
        if graph == "decoder" and lm_head:
            flipped = weight_first_matmuls(model)
            if flipped:
                say(f"decoder: {', '.join(flipped)} also stored as [in, out] for its MatMul (the tied lm_head)")
        # the RoPE rotate-half matrix is a +-1 permutation, not a weight: left exact
        keep = [n.name for n in model.graph.node if n.op_type == "MatMul" and "rope_rotate_half" in n.input[1]]
        qm, done, eligible = quantize_matmuls(model, block_size, keep)
        if done == 0:
            raise ValueError(f"{src_artifact / g}: no MatMul with a constant weight to quantize")
        say(f"{graph}: {done} of {eligible} MatMul weights stored as 8-bit blocks of {block_size}")
        save_graph(qm, out / g)
        written |= {g, g + ".data"}
        info["graphs"][graph] = {"matmuls_quantized": done, "matmuls_total": eligible}
    # everything else (the graphs kept as they are, tokenizer) is copied as it is
    for name in src.files:
        if name not in written:
            shutil.copyfile(src_artifact / name, out / name)
    dec = info["graphs"]["decoder"]
    info.update(matmuls_quantized=dec["matmuls_quantized"], matmuls_total=dec["matmuls_total"],
                seconds=round(time.perf_counter() - t0, 1))
    m = src.derive(
        precision=PRECISION, source=dict(src.source, base_artifact=str(src_artifact.resolve())),
        vision=replace(src.vision, **_io(out / src.vision.file)),
        decoder=replace(src.decoder, **_io(out / src.decoder.file)),
        files=_file_table(out), export=dict(src.export, weight_int8=info))
    af.write(out, m)
    total = sum(v["bytes"] for v in m.files.values())
    say(f"wrote {out} ({total / 2**20:.1f} MiB, {time.perf_counter() - t0:.0f} s)")
    return m
