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

    python -m quantize weight-int8 ARTIFACT OUT --target cpu [--bits 8|4]

The CPU flavour (`build_cpu`) starts from an FP32 artifact (fused `--target portable`, GroupQueryAttention
decoder), quantizes the tied lm_head too (a quarter of the weight bytes a decode step reads) and sets
MatMulNBits' `accuracy_level` to 4: ONNX Runtime's CPU kernels then quantize each activation row to 8 bits
per block and accumulate in integers (AVX2 / AVX512-VNNI / ARM dot-product), instead of dequantizing the
weights to FP32 on every call, which made the default 8-bit flavour 4x slower than FP32 on a CPU.  Its vision
graph's MatMuls (4,096 rows a page, not one) become ONNX MatMulInteger with activations quantized at run time
(`quantize_matmuls_dynamic`), which ONNX Runtime runs as one u8s8 integer GEMM each: their time fell to ~0.3x
FP32's, against ~0.5-0.7x for MatMulNBits (docs/int8.md has the figures).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from edgeocr import artifact as af
from quantize.fuse import PATCH_MATMUL

log = logging.getLogger("quantize")

PRECISION = "int8-weights"
PRECISION_4 = "int4-weights"
CPU_ACCURACY_LEVEL = 4      # MatMulNBits: 8-bit activations, integer accumulation


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


def kept_matmuls(model) -> list[str]:
    """MatMul nodes with a constant weight that stay at the artifact's precision: the RoPE rotate-half matrix (a
    +-1 permutation, not a weight: left exact) and the patch embedding (a Conv before quantize.fuse made it a
    MatMul; it stays as it was)."""
    return [n.name for n in model.graph.node if n.op_type == "MatMul"
            and ("rope_rotate_half" in n.input[1] or n.name.endswith(PATCH_MATMUL))]


def quantize_matmuls(model, block_size: int, keep: list[str] = (), bits: int = 8, accuracy_level: int | None = None):
    """Every MatMul with a constant 2-D weight (except the `keep` node names) -> MatMulNBits, `bits` bits,
    symmetric blocks of `block_size` inputs, computing at `accuracy_level` (None: the op's default, 0 = the
    activations' own type; 4 = integer accumulation on 8-bit activations).  Returns (quantized ModelProto,
    MatMuls quantized, MatMuls eligible)."""
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as e:
        raise ValueError(f"weight-only INT8 needs ONNX Runtime's quantization tools ({e}): "
                         "pip install 'edgeocr[int8]'") from None

    inits = {i.name for i in model.graph.initializer}
    eligible = sum(1 for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits and n.name not in keep)
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)  # a line per node
    q = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=True, nodes_to_exclude=list(keep),
                             op_types_to_quantize=("MatMul",), accuracy_level=accuracy_level)
    q.process()
    qm = q.model.model
    return qm, sum(1 for n in qm.graph.node if n.op_type == "MatMulNBits"), eligible


class _QuantizerChatter(logging.Filter):
    """Drops onnxruntime.quantization's root-logger lines: the advice to run its image-model pre-processing
    first, and a line per MatMul output whose type it takes from DefaultTensorType."""

    def filter(self, record):
        msg = record.getMessage()
        return "pre-processing before quantization" not in msg and "DefaultTensorType" not in msg


def quantize_matmuls_dynamic(path: Path, keep: list[str] = ()):
    """Every MatMul with a constant 2-D weight in the graph at `path` (except the `keep` node names) ->
    ONNX MatMulInteger: the weight as int8, symmetric, one scale per output channel; the activation quantized to
    uint8 at run time (DynamicQuantizeLinear, one scale and zero point per tensor).  ONNX Runtime's CPU provider
    fuses each into DynamicQuantizeMatMul, MLAS's u8s8 integer GEMM.  Returns (quantized ModelProto, MatMuls
    quantized, MatMuls eligible)."""
    import tempfile

    import onnx
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as e:
        raise ValueError(f"dynamic INT8 needs ONNX Runtime's quantization tools ({e}): "
                         "pip install 'edgeocr[int8]'") from None

    src = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in src.graph.initializer}
    eligible = sum(1 for n in src.graph.node if n.op_type == "MatMul" and n.input[1] in inits and n.name not in keep)
    quiet = _QuantizerChatter()
    logging.getLogger().addFilter(quiet)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            q = Path(tmp) / path.name
            # reduce_range: 7-bit weights, so that u8 x s7 pair sums fit int16 on x86 CPUs without VNNI
            # (AVX2 / AVX-512 without VNNI saturate u8 x s8 pairs; ONNX Runtime's quantization guide)
            quantize_dynamic(path, q, op_types_to_quantize=["MatMul"], per_channel=True, weight_type=QuantType.QInt8,
                             reduce_range=True, nodes_to_exclude=list(keep), use_external_data_format=True,
                             # MatMul outputs of ONNX Runtime's fused ops have no inferred type: FP32
                             extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT})
            qm = onnx.load(str(q))
    finally:
        logging.getLogger().removeFilter(quiet)
    return qm, sum(1 for n in qm.graph.node if n.op_type == "MatMulInteger"), eligible


def build_weight_int8(src_artifact: Path, out: Path, block_size: int = 32, lm_head: bool = False,
                      vision: bool = True, progress: Callable[[str], None] | None = None, bits: int = 8,
                      accuracy_level: int | None = None, target: str = "gpu",
                      vision_block_size: int | None = None, vision_dynamic: bool = False) -> af.Artifact:
    """FP16 (or FP32) artifact -> the same artifact with the MatMul weights in `bits`-bit blocks (8 or 4): the
    decoder's and, with `vision` (default), the vision encoder's, in blocks of `block_size` inputs
    (`vision_block_size` for the vision graph; None: the same).  `accuracy_level`: MatMulNBits' compute
    type (see quantize_matmuls); `target` ("gpu" | "cpu") is recorded in the manifest for `edgeocr doctor`.
    `vision_dynamic`: the vision graph's MatMuls as MatMulInteger with activations quantized at run time
    (quantize_matmuls_dynamic) instead of MatMulNBits.

    The (tied) lm_head stays as it is unless `lm_head`: ONNX Runtime 1.31's CUDA MatMulNBits has no
    one-row kernel for its shape (vocabulary-wide output) and dequantizes the whole matrix every step
    (measured on the H200: 0.13 ms a step, more than its FP16 GEMV), and keeping it shares the FP16
    embedding table instead of storing a second, INT8 copy."""
    import onnx

    from quantize.export import _file_table, _io, copy_unwritten
    from quantize.fuse import save_graph

    say = progress or (lambda s: log.info("%s", s))
    t0 = time.perf_counter()
    src_artifact, out = Path(src_artifact), Path(out)
    src = af.read(src_artifact)
    if src.precision not in ("fp16", "fp32"):
        raise ValueError(f"{src_artifact} is {src.precision}; weight-only INT8 starts from an FP16 or FP32 artifact")
    if bits not in (4, 8):
        raise ValueError(f"bits {bits}: MatMulNBits weights are 8 or 4 bits here")
    if accuracy_level not in (None, 0, 1, 2, 3, 4):
        raise ValueError(f"accuracy_level {accuracy_level}: MatMulNBits takes 0-4")
    if target not in ("gpu", "cpu"):
        raise ValueError(f"target {target!r}: 'gpu' or 'cpu'")
    vision_block_size = vision_block_size or block_size
    for b in (block_size, vision_block_size):
        if b < 16 or b & (b - 1):
            raise ValueError(f"block size {b}: must be a power of two >= 16 (MatMulNBits)")
    if out.resolve() == src_artifact.resolve():
        raise ValueError("OUT must differ from ARTIFACT")
    from quantize.export import prepare_out
    prepare_out(out)
    info = {"op": "com.microsoft.MatMulNBits", "bits": bits, "block_size": block_size, "symmetric": True,
            "activations": src.precision, "accuracy_level": accuracy_level or 0, "target": target,
            "lm_head": lm_head, "graphs": {}}
    written = set()
    for graph in ("decoder", "vision") if vision else ("decoder",):
        g = getattr(src, graph).file
        dynamic = graph == "vision" and vision_dynamic
        # weights loaded from beside the graph, except where quantize_matmuls_dynamic reads the file itself
        model = onnx.load(str(src_artifact / g), load_external_data=not dynamic)
        if graph == "decoder" and lm_head:
            flipped = weight_first_matmuls(model)
            if flipped:
                say(f"decoder: {', '.join(flipped)} also stored as [in, out] for its MatMul (the tied lm_head)")
        keep = kept_matmuls(model)
        if dynamic:
            qm, done, eligible = quantize_matmuls_dynamic(src_artifact / g, keep)
            form = {"op": "MatMulInteger",
                    "weights": "int8 in [-64, 64] (reduce_range), symmetric, per output channel",
                    "activations": "uint8, per tensor, quantized at run time (DynamicQuantizeLinear)"}
            say(f"{graph}: {done} of {eligible} MatMul weights stored as int8 per channel, activations "
                "quantized at run time (MatMulInteger, 7-bit weight range)")
        else:
            block = vision_block_size if graph == "vision" else block_size
            qm, done, eligible = quantize_matmuls(model, block, keep, bits, accuracy_level)
            form = {"op": "MatMulNBits", "block_size": block}
            say(f"{graph}: {done} of {eligible} MatMul weights stored as {bits}-bit blocks of {block}")
        if done == 0:
            raise ValueError(f"{src_artifact / g}: no MatMul with a constant weight to quantize")
        save_graph(qm, out / g)
        written |= {g, g + ".data"}
        info["graphs"][graph] = {"matmuls_quantized": done, "matmuls_total": eligible, **form}
    # everything else (the graphs kept as they are, tokenizer) is copied as it is
    copy_unwritten(src_artifact, out, src.files, written)
    dec = info["graphs"]["decoder"]
    info.update(matmuls_quantized=dec["matmuls_quantized"], matmuls_total=dec["matmuls_total"],
                seconds=round(time.perf_counter() - t0, 1))
    m = src.derive(
        precision=PRECISION if bits == 8 else PRECISION_4,
        source=dict(src.source, base_artifact=str(src_artifact.resolve())),
        vision=replace(src.vision, **_io(out / src.vision.file)),
        decoder=replace(src.decoder, **_io(out / src.decoder.file)),
        files=_file_table(out), export=dict(src.export, weight_int8=info))
    af.write(out, m)
    total = sum(v["bytes"] for v in m.files.values())
    say(f"wrote {out} ({total / 2**20:.1f} MiB, {time.perf_counter() - t0:.0f} s)")
    return m


def build_cpu(src_artifact: Path, out: Path, bits: int = 8, block_size: int = 32,
              progress: Callable[[str], None] | None = None) -> af.Artifact:
    """FP32 artifact -> the CPU flavour: every decoder MatMul weight, the tied lm_head included, in `bits`-bit
    blocks computed with integer accumulation (accuracy_level 4); every vision MatMul as MatMulInteger (int8
    weights per channel, activations quantized at run time: MLAS's u8s8 GEMM, faster than MatMulNBits over the
    4,096 rows of a page, docs/int8.md has the figures).  The artifact should be the
    GroupQueryAttention decoder (attention over the live length, cache written in place), fused with
    `python -m quantize fuse --target portable`."""
    src = af.read(Path(src_artifact))
    if src.precision != "fp32":
        raise ValueError(f"{src_artifact} is {src.precision}: the CPU flavour starts from an FP32 artifact "
                         "(ONNX Runtime's CPU provider computes FP16 activations slowly and has no FP16 "
                         "GroupQueryAttention); export with --precision fp32")
    if src.export.get("fusion", {}).get("cuda_only_ops"):
        raise ValueError(f"{src_artifact} was fused for CUDA; fuse the exported artifact with --target portable")
    say = progress or (lambda s: log.info("%s", s))
    if src.decoder.attention != "gqa":
        say("note: masked decoder: each step attends over the whole static cache; export with --attention gqa "
            "for attention over the live length only")
    return build_weight_int8(src_artifact, out, block_size=block_size, lm_head=True, vision=True, progress=progress,
                             bits=bits, accuracy_level=CPU_ACCURACY_LEVEL, target="cpu", vision_dynamic=True)
