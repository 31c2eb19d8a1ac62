"""The decoder's weights for edgeocr's own decode step: one file the CUDA kernels and ONNX Runtime share.

    python -m quantize native-step ARTIFACT OUT [--weights float|int8] [--vision float|int8] [--embedding float|int8]

For an FP16 or FP32 artifact exported with `--attention gqa --select-on-device`, fused or not (not weight-INT8,
not step state).  A decode step on ONNX Runtime's CUDA provider launches ~15 kernels a layer, each a few
microseconds long (docs/perf.md §6); the runtime's native step (edgeocr.backends.native_step) runs the same
computation as 8 kernels a layer of its own (edgeocr/kernels), captured in one CUDA graph.  Its kernels read the
weights row-major ([out, in], each output's weights contiguous), the transpose of ONNX's MatMul layout.  So that
the weights are not held twice (on disk and on the device), this pass moves them out of the decoder graph:

    decoder_step.bin         the weights in the kernels' layout: per layer q|k|v [(nq + 2 kvh) D, H], o [H, nq D],
                             gate|up [2 I, H] (gate rows, then up rows), down [H, I], the four norm weights;
                             the embedding [V, H] (the tied lm_head) and the final norm
    the decoder graph        every weight MatMul(x, W) becomes com.microsoft FusedMatMul(x, W_t, transB=1), W_t a
                             graph input; the embedding (and an untied lm_head) become graph inputs too.  The
                             runtime binds them to its copy of decoder_step.bin for the prefill, which stays on
                             ONNX Runtime (GEMMs), and for the ONNX Runtime step (EDGEOCR_NATIVE_STEP=0)

With `--weights int8` the layers' projections are stored as 8-bit blocks of 32 along their input (a weight is
(q - 128) * scale, one FP16/FP32 scale a block): ONNX Runtime's MatMulNBits layout, so the graph reads the same
bytes through MatMulNBits(x, W, W.scales) and the native step through its 8-bit GEMVs; the projections take half
their bytes.  The norms stay in the artifact's precision, and so do the embedding and the lm_head with `--embedding
float` (the default with float weights): a real-size step then reads about 2/3 of the FP16 step's weight bytes
(computed).  With `--weights int8` the vision graph's MatMul weights become
8-bit MatMulNBits blocks of 32 too (`--vision float` keeps them): the vision encoder's 0.8 GB of FP16 weights are
most of what the 8-bit form would otherwise hold beside its decoder (`quantize weight-int8` does the same to it).
`--weights float --vision int8` keeps the FP16 decoder and takes the 8-bit vision graph: on an H100 (real size,
2026-12-06, docs/perf.md section 19) the fastest first token, 22.0-22.3 ms from the JPEG and 19.3-19.5 ms from
pixels, in 2,813 MiB (the runtime replays the vision graph as a CUDA graph by default where the vision weights are
8-bit: edgeocr.ort_options.vision_graph_default).

With `--embedding int8` the embedding (the tied lm_head; an untied lm_head too) is stored as 8-bit blocks of 32 along
its rows the same way: the prefill's embedding lookup becomes com.microsoft GatherBlockQuantized and its lm_head
MatMulNBits over those bytes, and the native step reads them through its 8-bit embedding and lm_head kernels
(the real decoder's 236 MiB embedding takes 125 MiB).  Its rows are padded to a multiple of 8 (weights 128, scales 0):
ONNX Runtime's CUDA MatMulNBits runs its one-row 8-bit kernel only where N is a multiple of 8, and otherwise
dequantizes the whole table into its arena for a cuBLAS GEMM on every prefill (236 MiB for the real 120,818-row
lm_head); a Slice keeps the vocabulary's logits.

The manifest's `graphs.decoder.native_step` indexes the file ({"tensors": name -> offset, shape}) and maps each
graph input to its tensor and first row ({"inputs": name -> [tensor, row, shape]}).  Weights are found by the
decoder's own names (decoder.layers.N.ln1, ...) and, for the projections, by their order in the graph (q|k|v, o,
gate|up or gate and up, down per layer), each checked against the manifest's sizes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from edgeocr import artifact as af
from edgeocr.backends.native_step import Q8_TABLE_ROWS

log = logging.getLogger("edgeocr.quantize")

# by embedding: an older runtime refuses an 8-bit one by its version (edgeocr.backends.native_step.VERSIONS; 3: the
# 8-bit tables' rows padded, pad_rows)
NATIVE_STEP_VERSION = {"float": 1, "int8": 3}
WEIGHTS_FILE = "decoder_step.bin"
ALIGN = 256                                   # bytes: every tensor starts on a 256-byte boundary
INPUT_PREFIX = "native."
BLOCK = 32                                    # 8-bit weights: values per scale, along the reduction
SCALES = ".scales"                            # an 8-bit tensor's scales: the tensor's name + this
PROJECTIONS = ("qkv", "o", "gate_up", "down")


def _shape(t) -> list[int]:
    return [int(d) for d in t.dims]


def find_weights(model, text: dict) -> tuple[dict[str, np.ndarray], dict[str, tuple[str, int, list[int]]], list]:
    """The decoder ModelProto's weights in the kernels' layout, and how the graph's weight inputs map onto them.
    Returns (tensors: name -> array, inputs: graph input name -> (tensor, first row, shape [n, k]),
    rewrites: [(node, initializer name, graph input name)] for the MatMuls to turn into FusedMatMul)."""
    from onnx import numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    alias = {n.output[0]: n.input[0] for n in g.node if n.op_type == "Identity" and n.input[0] in inits}

    def init(name: str):
        name = alias.get(name, name)
        if name not in inits:
            raise ValueError(f"the decoder graph has no weight {name!r}: not a decoder exported by edgeocr")
        return numpy_helper.to_array(inits[name])

    L, H, inter = text["num_layers"], text["hidden_size"], text["intermediate_size"]
    nq, kvh, d, V = text["num_heads"], text["num_kv_heads"], text["head_dim"], text["vocab_size"]
    # the projections: MatMuls whose second input is a 2-D weight, in graph order (RoPE's own tables excluded)
    mats = []
    for n in g.node:
        if n.op_type == "MatMulNBits" or (n.op_type == "DequantizeLinear" and n.input[0] in inits):
            raise ValueError("the native decode step needs FP16 or FP32 weights; this decoder's are quantized "
                             "(build the native step from the FP16 artifact, before weight-int8)")
        if n.op_type != "MatMul" or len(n.input) < 2:
            continue
        w = alias.get(n.input[1], n.input[1])
        if w in inits and len(inits[w].dims) == 2 and "rope" not in w:
            mats.append((n, w))
    per = len(mats) // L if L else 0
    if per not in (4, 5) or per * L != len(mats):
        raise ValueError(f"the decoder graph has {len(mats)} weight MatMuls for {L} layers (4 or 5 a layer "
                         "expected: q|k|v, o, gate|up or gate and up, down): not a GroupQueryAttention decoder "
                         "exported by edgeocr")
    W = nq * d + 2 * kvh * d
    expect = ([("qkv", [H, W]), ("o", [nq * d, H]), ("gate_up", [H, 2 * inter]), ("down", [inter, H])] if per == 4 else
              [("qkv", [H, W]), ("o", [nq * d, H]), ("gate", [H, inter]), ("up", [H, inter]), ("down", [inter, H])])
    tensors: dict[str, np.ndarray] = {}
    inputs: dict[str, tuple[str, int, list[int]]] = {}
    rewrites = []
    dtype = None
    for i in range(L):
        got = {}
        for (node, w), (role, shape) in zip(mats[i * per:(i + 1) * per], expect):
            if _shape(inits[w]) != shape:
                raise ValueError(f"layer {i}: the {role} projection's weight {w!r} is {_shape(inits[w])}, "
                                 f"the manifest's sizes say {shape}")
            got[role] = (node, w, numpy_helper.to_array(inits[w]))
            dtype = dtype or got[role][2].dtype
        p = f"layers.{i}."
        tensors[p + "qkv"] = np.ascontiguousarray(got["qkv"][2].T)
        tensors[p + "o"] = np.ascontiguousarray(got["o"][2].T)
        if per == 4:
            tensors[p + "gate_up"] = np.ascontiguousarray(got["gate_up"][2].T)          # gate rows, then up rows
        else:
            tensors[p + "gate_up"] = np.ascontiguousarray(np.concatenate([got["gate"][2].T, got["up"][2].T]))
        tensors[p + "down"] = np.ascontiguousarray(got["down"][2].T)
        roles = [("qkv", p + "qkv", 0, [W, H]), ("o", p + "o", 0, [H, nq * d]), ("down", p + "down", 0, [H, inter])]
        roles += ([("gate_up", p + "gate_up", 0, [2 * inter, H])] if per == 4 else
                  [("gate", p + "gate_up", 0, [inter, H]), ("up", p + "gate_up", inter, [inter, H])])
        for role, tensor, row, shape in roles:
            node, w, _ = got[role]
            name = INPUT_PREFIX + (tensor if role not in ("gate", "up") else p + role)
            inputs[name] = (tensor, row, shape)
            rewrites.append((node, w, name))
        for norm, size in (("ln1", H), ("ln2", H), ("qn", d), ("kn", d)):
            a = init(f"decoder.layers.{i}.{norm}")
            if a.shape != (size,):
                raise ValueError(f"decoder.layers.{i}.{norm} is {list(a.shape)}, expected [{size}]")
            tensors[p + norm] = a.astype(dtype)
    tensors["norm"] = init("decoder.norm").astype(dtype)
    embed = init("decoder.embed")
    if embed.shape != (V, H):
        raise ValueError(f"decoder.embed is {list(embed.shape)}, expected [{V}, {H}]")
    tensors["embed"] = embed
    inputs[INPUT_PREFIX + "embed"] = ("embed", 0, [V, H])
    if "decoder.lm_head" in inits or "decoder.lm_head" in alias:
        tensors["lm_head"] = init("decoder.lm_head")
        inputs[INPUT_PREFIX + "lm_head"] = ("lm_head", 0, [V, H])
    return tensors, inputs, rewrites


def rewire(model, inputs: dict[str, tuple[str, int, list[int]]], rewrites: list, tensors: dict[str, np.ndarray],
           bits: int | None = None, embedding_bits: int | None = None) -> dict[str, int]:
    """The weight MatMuls -> FusedMatMul(x, input, transB=1), or with 8-bit weights MatMulNBits(x, input,
    input.scales) over the same bytes; the embedding and lm_head initializers -> inputs of the same tensors; every
    initializer no node reads any more is dropped."""
    from onnx import helper

    g = model.graph
    for node, _, name in rewrites:
        a, out, nm = node.input[0], node.output[0], node.name
        node.Clear()
        if bits:
            n, kb, blk = inputs[name][2]
            node.CopyFrom(helper.make_node("MatMulNBits", [a, name, name + SCALES], [out], name=nm + "_native",
                                           domain="com.microsoft", K=kb * blk, N=n, bits=bits, block_size=blk))
        else:
            node.CopyFrom(helper.make_node("FusedMatMul", [a, name], [out], name=nm + "_native",
                                           domain="com.microsoft", transA=0, transB=1, alpha=1.0))
    renamed = {"decoder.embed": INPUT_PREFIX + "embed", "decoder.lm_head": INPUT_PREFIX + "lm_head"}
    for n in g.node:
        for j, x in enumerate(n.input):
            if x in renamed:
                n.input[j] = renamed[x]
    for n in list(g.node):      # Identity copies of the embedding (a checkpoint's tied weights) read it directly
        if n.op_type == "Identity" and n.input[0] in renamed.values():
            for m in g.node:
                for j, x in enumerate(m.input):
                    if x == n.output[0]:
                        m.input[j] = n.input[0]
            g.node.remove(n)
    done = {}
    if embedding_bits:
        done["embedding_8bit_nodes"] = _rewire_embedding(g, inputs, tensors)
    used = {x for n in g.node for x in n.input}
    keep = [i for i in g.initializer if i.name in used]
    dropped = len(g.initializer) - len(keep)
    del g.initializer[:]
    g.initializer.extend(keep)
    have = {i.name for i in g.input}
    for name, (tensor, _, shape) in inputs.items():
        if name in used and name not in have:
            elem = helper.np_dtype_to_tensor_dtype(tensors[tensor].dtype)
            g.input.append(helper.make_tensor_value_info(name, elem, shape))
    unused = sorted(n for n in inputs if n not in used)
    for n in unused:
        del inputs[n]
    if not any(op.domain == "com.microsoft" for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return {("matmul_nbits" if bits else "fused_matmuls"): len(rewrites), "initializers_dropped": dropped,
            "weight_inputs": len(inputs), **done}


NBITS = ".nbits"                              # an 8-bit embedding read by MatMulNBits: its input's name + this
ZERO_POINTS = ".zero_points"                  # GatherBlockQuantized's zero points (128), a graph initializer


def _rewire_embedding(g, inputs: dict, tensors: dict[str, np.ndarray]) -> int:
    """The nodes reading an 8-bit embedding or lm_head (native.embed, native.lm_head) onto its blocks:
    Gather(table, ids) -> GatherBlockQuantized(table, ids, scales); the lm_head, Gemm(h, table, transB=1) or the
    exported Transpose(h) -> MatMul(table, .) -> Transpose, -> MatMulNBits(h, table as [V, H / 32, 32], scales).
    Returns the nodes rewritten; a node of any other kind reading the table is refused."""
    from onnx import helper, numpy_helper

    consumers = {}
    for n in g.node:
        for x in n.input:
            consumers.setdefault(x, []).append(n)
    producer = {o: n for n in g.node for o in n.output}
    count = 0
    for tensor in ("embed", "lm_head"):
        name = INPUT_PREFIX + tensor
        if tensor + SCALES not in tensors:
            continue
        rows, k = tensors[tensor].shape             # rows: v padded (pad_rows)
        v = inputs[name][2][0]
        scales = (tensor + SCALES, 0, [v, k // BLOCK])
        nbits = (name + NBITS, (tensor, 0, [rows, k // BLOCK, BLOCK]), (tensor + SCALES, 0, [rows * (k // BLOCK)]))
        for n in list(consumers.get(name, [])):
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            if n.op_type == "Gather" and list(n.input[:1]) == [name] and attrs.get("axis", 0) == 0:
                # the zero point 128 given explicitly: some ONNX Runtime CUDA kernels of this op took 0 for uint8
                zp = name + ZERO_POINTS
                if zp not in {i.name for i in g.initializer}:
                    g.initializer.append(numpy_helper.from_array(np.full((v, k // BLOCK), 128, np.uint8), zp))
                new = helper.make_node("GatherBlockQuantized", [name, n.input[1], name + SCALES, zp], list(n.output),
                                       name=n.name + "_q8", domain="com.microsoft", gather_axis=0, quantize_axis=1,
                                       block_size=BLOCK, bits=8)
                inputs[name + SCALES] = scales
                g.node.insert(list(g.node).index(n), new)
                g.node.remove(n)
            elif (n.op_type == "Gemm" and list(n.input) == [n.input[0], name] and attrs.get("transB") == 1
                  and not attrs.get("transA") and attrs.get("alpha", 1.0) == 1.0):
                _matmul_nbits(g, n, n.input[0], n.output[0], nbits, v, k)
            elif n.op_type == "MatMul" and n.input[0] == name:
                tr, after = producer.get(n.input[1]), consumers.get(n.output[0], [])
                ok = (tr is not None and tr.op_type == "Transpose" and len(after) == 1
                      and after[0].op_type == "Transpose"
                      and all([list(helper.get_attribute_value(a)) for a in t.attribute if a.name == "perm"]
                              == [[1, 0]] for t in (tr, after[0])))
                if not ok:
                    raise ValueError(f"the decoder's lm_head {n.name!r} reads {name} in a form this pass does not "
                                     "rewrite for an 8-bit embedding (Gemm with transB, or Transpose-MatMul-"
                                     "Transpose)")
                _matmul_nbits(g, n, tr.input[0], after[0].output[0], nbits, v, k)
                g.node.remove(after[0])
                if len(consumers.get(tr.output[0], [])) == 1:
                    g.node.remove(tr)
            else:
                raise ValueError(f"node {n.name!r} ({n.op_type}) reads the embedding {name}: this pass rewrites "
                                 "only its Gather and the lm_head for --embedding int8")
            count += 1
        if any(x == name for m in g.node if m.op_type != "GatherBlockQuantized" for x in m.input):
            raise ValueError(f"{name} is still read as a float table after --embedding int8")
        inputs[nbits[0]], inputs[nbits[0] + SCALES] = nbits[1], nbits[2]
    return count


def _matmul_nbits(g, node, a: str, out: str, nbits: tuple, v: int, k: int) -> None:
    """node -> MatMulNBits(a, the 8-bit table, its scales) -> out, in node's place.  Over a table whose rows are
    padded (pad_rows), MatMulNBits computes every stored row and a Slice keeps the first v logits."""
    from onnx import helper, numpy_helper

    rows = nbits[1][2][0]
    y = out if rows == v else out + "_padded"
    new = [helper.make_node("MatMulNBits", [a, nbits[0], nbits[0] + SCALES], [y], name=node.name + "_q8",
                            domain="com.microsoft", K=k, N=rows, bits=8, block_size=BLOCK)]
    if rows != v:
        ends = node.name + "_q8_vocab"
        g.initializer.extend([numpy_helper.from_array(np.array([0], np.int64), ends + "_start"),
                              numpy_helper.from_array(np.array([v], np.int64), ends),
                              numpy_helper.from_array(np.array([-1], np.int64), ends + "_axis")])
        new.append(helper.make_node("Slice", [y, ends + "_start", ends, ends + "_axis"], [out],
                                    name=node.name + "_q8_slice"))
    at = list(g.node).index(node)
    for i, n in enumerate(new):
        g.node.insert(at + i, n)
    g.node.remove(node)


def pad_rows(q: np.ndarray, scales: np.ndarray, multiple: int = Q8_TABLE_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """8-bit blocks (quantize_rows) with rows appended up to a multiple of `multiple`: weights 128 (zero) and scales
    0 (module doc: ONNX Runtime's one-row 8-bit MatMulNBits kernel needs it).  The lookup reads the first V rows;
    the lm_head's MatMulNBits computes all of them and a Slice drops the padding's logits."""
    pad = (-q.shape[0]) % multiple
    if not pad:
        return q, scales
    return (np.concatenate([q, np.full((pad, q.shape[1]), 128, np.uint8)]),
            np.concatenate([scales, np.zeros((pad, scales.shape[1]), scales.dtype)]))


def quantize_rows(a: np.ndarray, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """[n, k] -> (q [n, k] uint8, scales [n, k / block] in a's dtype): symmetric 8-bit blocks along k, stored with
    ONNX Runtime MatMulNBits' default zero point (a weight is (q - 128) * scale); the scale is rounded to a's
    dtype before the weights are divided by it."""
    n, k = a.shape
    if k % block:
        raise ValueError(f"8-bit weights need the reduction size {k} to be a multiple of {block}")
    blocks = a.astype(np.float32).reshape(n, k // block, block)
    scales = (np.abs(blocks).max(-1) / 127.0).astype(a.dtype)
    s32 = scales.astype(np.float32)
    safe = np.where(s32 > 0, s32, 1.0)[..., None]
    q = np.clip(np.rint(blocks / safe), -127, 127).astype(np.int16) + 128
    return q.astype(np.uint8).reshape(n, k), scales


def quantize_projections(tensors: dict[str, np.ndarray], inputs: dict, block: int = BLOCK) -> None:
    """The layers' projections (q|k|v, o, gate|up, down) as 8-bit blocks, in place: each tensor T becomes uint8 with
    its scales in T.scales; each graph input that read T reads its rows as MatMulNBits' B [n, k / block, block],
    and a second input its scales [n * k / block]."""
    for name in [t for t in tensors if t.rsplit(".", 1)[-1] in PROJECTIONS]:
        tensors[name], tensors[name + SCALES] = quantize_rows(tensors[name], block)
    for name, (tensor, row, shape) in list(inputs.items()):
        if tensor.rsplit(".", 1)[-1] in PROJECTIONS:
            n, k = shape
            inputs[name] = (tensor, row, [n, k // block, block])
            inputs[name + SCALES] = (tensor + SCALES, row, [n * (k // block)])


def write_weights(path: Path, tensors: dict[str, np.ndarray]) -> dict[str, dict]:
    """The tensors, each 256-byte aligned, into one raw file; returns the index (name -> offset, shape)."""
    index, off = {}, 0
    if path.exists():
        path.unlink()             # not written through: `quantize reslot` hard-links an artifact's files
    with open(path, "wb") as f:
        for name, a in tensors.items():
            pad = (-off) % ALIGN
            f.write(b"\0" * pad)
            off += pad
            index[name] = {"offset": off, "shape": list(a.shape), "dtype": a.dtype.name}
            f.write(np.ascontiguousarray(a).tobytes())
            off += a.nbytes
    return index


def _vision_gemms_skipped(m: af.Artifact, wanted: bool | None) -> str | None:
    """Why the vision GEMM passes will not run on `m`'s vision graph (`wanted` None: where `m` is fused and its
    fusion did not apply them), or None."""
    fusion = m.export.get("fusion") or {}
    if fusion.get("options", {}).get("vision_gemms"):
        return "already applied by the fusion"
    if wanted is None and not fusion:
        return "the artifact is not fused"
    if wanted is False:
        return "not asked"
    return None


def _vision_gemms(vg, m: af.Artifact, wanted: bool | None, qkv: str = "three") -> dict:
    """The vision GEMM passes on the vision ModelProto `vg` in place (see _vision_gemms_skipped); {pass: rewrites}
    or {"skipped": why}."""
    why = _vision_gemms_skipped(m, wanted)
    if why:
        return {"skipped": why}
    from quantize.fuse import vision_gemms
    return vision_gemms(vg, qkv)


PACKED_QKV_OP = "MultiHeadAttention packed q|k|v (vision)"


def _export_with(export: dict, report: dict, vision_qkv: str) -> dict:
    """The manifest's export record with the native-step report, and the packed vision attention among the fusion's
    CUDA-only ops where it was written (the runtime refuses other devices with a clear error)."""
    out = dict(export, native_step=report)
    if vision_qkv == "packed" and (report["vision"].get("gemm_passes") or {}).get("attention_qkv"):
        fusion = dict(export.get("fusion") or {})
        fusion["cuda_only_ops"] = [*fusion.get("cuda_only_ops", []), PACKED_QKV_OP]
        out["fusion"] = fusion
    return out


def native_step_artifact(src: Path, out: Path, progress=None, weights: str = "float",
                         vision: str | None = None, embedding: str | None = None,
                         vision_gemms: bool | None = None, vision_qkv: str | None = None) -> af.Artifact:
    """ARTIFACT -> OUT with the decoder's weights in decoder_step.bin and read by the graph as inputs (module
    doc).  weights "int8": the layers' projections as 8-bit blocks (MatMulNBits' layout, read by the native step's
    8-bit kernels and by the graph); the norms stay in the artifact's precision.
    vision "int8" (the default with 8-bit weights): the vision graph's MatMul weights as 8-bit MatMulNBits blocks
    of 32 (quantize.weight_int8); "float" (the default otherwise): the vision graph is copied.  The tokenizer is
    copied.  embedding "int8" (the default with 8-bit weights): the embedding (and an untied lm_head) as 8-bit blocks
    of 32 (module doc); "float" (the default otherwise) keeps it in the artifact's precision.
    vision_gemms (None: with 8-bit vision weights, for a fused ARTIFACT whose fusion did not apply them): the vision
    GEMM passes of `quantize fuse --vision-gemms` (q, k, v as three MatMuls, the patch Conv as one MatMul) before the
    vision weights are quantized.  With 8-bit weights they cost no device memory: on an H100 (real size, 2026-12-06,
    docs/perf.md section 18) 2,342.8 MiB after two pages against 2,366.8 without them, vision 15.1 against 16.3 ms;
    with FP16 weights they take 88 MiB more, past that flavour's 3,072 MiB target, hence opt-in there (fuse).
    vision_qkv (None: "packed" for an ARTIFACT whose fusion for CUDA already made it CUDA-only, else "three"): how
    those passes hand q, k and v to MultiHeadAttention, as three MatMuls or as one MatMul into its packed q|k|v input
    (CUDA only; on an H100 135 kernels fewer, 0.2 ms of vision GPU time less, the same embeddings: docs/perf.md
    section 24)."""
    if weights not in ("float", "int8"):
        raise ValueError(f"weights must be 'float' or 'int8', not {weights!r}")
    embedding = embedding or weights
    if embedding not in ("float", "int8"):
        raise ValueError(f"embedding must be 'float' or 'int8', not {embedding!r}")
    vision = vision or ("int8" if weights == "int8" else "float")
    if vision not in ("float", "int8"):
        raise ValueError(f"vision must be 'float' or 'int8', not {vision!r}")
    if vision_gemms and vision != "int8":
        raise ValueError("the vision GEMM passes come with 8-bit vision weights here (--vision int8); for an FP16 "
                         "vision graph fuse with --vision-gemms")
    from quantize.export import _file_table, _io, copy_unwritten
    from quantize.fuse import load_graph, op_counts, save_graph

    say = progress or (lambda s: log.info("%s", s))
    t0 = time.perf_counter()
    src, out = Path(src), Path(out)
    m = af.read(src)
    from quantize.fuse import VISION_QKV
    fusion = m.export.get("fusion") or {}
    if vision_qkv is not None:
        if vision != "int8":
            raise ValueError("the vision q|k|v layout belongs to the GEMM passes of 8-bit vision weights "
                             "(--vision int8)")
        if vision_qkv not in VISION_QKV:
            raise ValueError(f"vision q|k|v layout must be one of {VISION_QKV}, not {vision_qkv!r}")
        why = _vision_gemms_skipped(m, vision_gemms)
        if why:
            raise ValueError(f"{src}: --vision-qkv {vision_qkv} shapes the vision GEMM passes, which do not run here "
                             f"({why})")
    else:   # packed where the artifact is CUDA-only already (a fusion for CUDA with its GroupQueryAttention norms)
        vision_qkv = "packed" if fusion.get("target") == "cuda" and fusion.get("cuda_only_ops") else "three"
    if vision_qkv == "packed" and fusion.get("target") != "cuda":
        raise ValueError(f"{src}: --vision-qkv packed feeds MultiHeadAttention's packed q|k|v input, which only ONNX "
                         "Runtime's CUDA provider implements: it needs an artifact fused with --target cuda")
    if m.decoder.attention != "gqa" or not m.decoder.select_on_device:
        raise ValueError(f"{src}: the native decode step needs a decoder exported with --attention gqa "
                         "--select-on-device")
    if m.decoder.step_state:
        raise ValueError(f"{src}: the native decode step does not take a step-state decoder; use the artifact it "
                         "was made from")
    if m.decoder.native_step:
        raise ValueError(f"{src} already has its native decode step's weights")
    if m.export.get("weight_int8") or m.precision not in ("fp16", "fp32"):
        raise ValueError(f"{src} is {m.export.get('weight_int8') and 'weight-int8' or m.precision}: the native decode "
                         "step starts from an FP16 or FP32 artifact (for 8-bit weights: --weights int8)")
    if out.resolve() == src.resolve():
        raise ValueError("OUT must differ from ARTIFACT")
    t = m.model["text"]
    widths = {"hidden": t["hidden_size"], "attention": t["num_heads"] * t["head_dim"],
              "intermediate": t["intermediate_size"]}
    odd = {k: v for k, v in widths.items() if v % BLOCK}
    if embedding == "int8" and widths["hidden"] % BLOCK:
        raise ValueError(f"{src}: an 8-bit embedding takes blocks of {BLOCK} along its rows, and this decoder's "
                         f"hidden width {widths['hidden']} is not a multiple of {BLOCK}")
    if weights == "int8" and odd:
        what = ", ".join(f"{k} width {v}" for k, v in odd.items())
        raise ValueError(f"{src}: 8-bit weights take blocks of {BLOCK} along each projection's input, and this "
                         f"decoder's {what} is not a multiple of {BLOCK}")
    from quantize.export import prepare_out
    prepare_out(out)
    model = load_graph(src / m.decoder.file)
    before = op_counts(model)
    tensors, inputs, rewrites = find_weights(model, m.model["text"])
    dtypes = {a.dtype for a in tensors.values()}
    if len(dtypes) != 1 or next(iter(dtypes)) not in (np.float16, np.float32):
        raise ValueError(f"the decoder's weights must all be float16 or all float32, not {sorted(map(str, dtypes))}")
    act = next(iter(dtypes))
    if weights == "int8":
        quantize_projections(tensors, inputs)
    if embedding == "int8":
        for t in ("embed", "lm_head"):
            if t in tensors:
                tensors[t], tensors[t + SCALES] = pad_rows(*quantize_rows(tensors[t]))
    done = rewire(model, inputs, rewrites, tensors, bits=8 if weights == "int8" else None,
                  embedding_bits=8 if embedding == "int8" else None)
    save_graph(model, out / m.decoder.file)
    index = write_weights(out / WEIGHTS_FILE, tensors)
    written = {m.decoder.file, m.decoder.file + ".data"}
    vision_report = {"weights": "float"}
    if vision == "int8":
        from quantize.weight_int8 import kept_matmuls, quantize_matmuls
        vg = load_graph(src / m.vision.file)
        gemms = _vision_gemms(vg, m, vision_gemms, vision_qkv)
        if "skipped" not in gemms:
            say(f"vision: q|k|v as {'three MatMuls' if vision_qkv == 'three' else 'one packed MatMul'} in "
                f"{gemms['attention_qkv']} layers, the patch Conv as a MatMul "
                f"({gemms['patch_gemm']})" + ("" if any(gemms.values()) else ": no pattern matched, the vision "
                                              "graph is as fused"))
        qv, qdone, eligible = quantize_matmuls(vg, BLOCK, kept_matmuls(vg), 8, None)
        if qdone == 0:
            raise ValueError(f"{src / m.vision.file}: no MatMul with a constant weight to quantize (--vision float "
                             "keeps the vision graph as it is)")
        save_graph(qv, out / m.vision.file)
        written |= {m.vision.file, m.vision.file + ".data"}
        vision_report = {"weights": "int8", "op": "com.microsoft.MatMulNBits", "bits": 8, "block_size": BLOCK,
                         "matmuls_quantized": qdone, "matmuls_total": eligible, "gemm_passes": gemms,
                         "qkv": vision_qkv if gemms.get("attention_qkv") else None}
        say(f"vision: {qdone} of {eligible} MatMul weights stored as 8-bit blocks of {BLOCK}")
    copy_unwritten(src, out, m.files, written)
    version = NATIVE_STEP_VERSION[embedding]
    spec = {"version": version, "file": WEIGHTS_FILE, "dtype": str(act), "weights": weights, "embedding": embedding,
            "block": BLOCK if weights == "int8" else None,
            "tensors": index, "inputs": {k: [t, r, s] for k, (t, r, s) in inputs.items()}}
    report = {"version": version, **done, "ops_before": before, "ops_after": op_counts(model),
              "vision": vision_report, "seconds": round(time.perf_counter() - t0, 1)}
    new = m.derive(decoder=replace(m.decoder, native_step=spec, **_io(out / m.decoder.file)),
                   vision=replace(m.vision, **_io(out / m.vision.file)),
                   files=_file_table(out), export=_export_with(m.export, report, vision_qkv),
                   source=dict(m.source, base_artifact=str(src.resolve())))
    af.write(out, new)
    say(f"wrote {out}: {len(tensors)} decoder weights in {WEIGHTS_FILE}, read by the graph as "
        f"{len(inputs)} inputs ({report['seconds']:.0f} s)")
    return new
