"""Post-export fusions for ONNX Runtime: fewer, larger kernels per decode step and per vision call.

    python -m quantize.fuse ARTIFACT OUT [--target cuda|portable] [--no-gqa-qk-norm]

A decode step of the 0.5B decoder does little arithmetic: on a large GPU it is bound by how many small
kernels run one after another (about 30 per layer as exported), not by the bytes it reads.  These passes
rewrite an exported artifact's graphs into fewer, fused ONNX Runtime ops.  Inputs and outputs keep their
names, shapes and dtypes, so the runtime binds a fused artifact exactly like the unfused one.

target "portable" (ops every ONNX Runtime execution provider implements, CPU included):
  rms_norm         [Cast] Pow ReduceMean Add Sqrt Div Mul [Cast] Mul(w) -> SimplifiedLayerNormalization
  skip_rms_norm    residual Add + SimplifiedLayerNormalization -> SkipSimplifiedLayerNormalization
                   (onnxruntime.transformers' FusionSkipLayerNormalization)
  layer_norm_fp16  Cast(fp32) LayerNormalization Cast(fp16) -> LayerNormalization on fp16 (fp32 statistics)
  skip_layer_norm  residual Add + LayerNormalization -> SkipLayerNormalization (FusionSkipLayerNormalization)
  skip_norm_bias   the projection's bias Add in front of a Skip*LayerNormalization -> its bias input
  gelu, bias_gelu  erf GELU -> Gelu; projection bias Add + Gelu -> BiasGelu (FusionGelu, FusionBiasGelu)
  attention_bias   q|k|v bias Add before the Split -> MultiHeadAttention's bias input
  lm_head          Transpose MatMul(W) Transpose over the tied embedding -> Gemm(x, W, transB=1)
  rope             x*cos + (x@R)*sin (Mul, MatMul, Mul, Add) -> (x * [cos|sin']) @ [I; R] (Mul, MatMul), the
                   [cos|sin'] table built once per run for every layer
  gate_up          gate|up MatMul + two Slices -> two MatMuls over the weight's halves (no slice kernels)
  attention_qkv    vision, opt-in (--vision-gemms): q|k|v MatMul + Split -> three MatMuls feeding
                   MultiHeadAttention (no Split kernel)
  patch_gemm       vision, opt-in (--vision-gemms): the patch embedding's Conv (stride = kernel) -> patch rows
                   @ W + bias (one GEMM)
target "cuda" adds ops that only ONNX Runtime's CUDA execution provider implements (the CPU provider
rejects them at load):
  gqa_qk_norm      q|k|v stays one packed tensor (no Split): RoPE runs over all heads with cos/sin tables that
                   leave the value heads unchanged, and the Q/K RMSNorm runs inside GroupQueryAttention
                   (its q_norm_weight / k_norm_weight prologue, applied after our RoPE as the model requires)
  packed q|k|v     vision, where `quantize native-step` asks for it (--vision-qkv packed, its default for a CUDA
                   fusion with gqa_qk_norm): the attention_qkv pass writes one MatMul whose columns are in
                   [head, q|k|v, dim] order, feeding MultiHeadAttention's packed q|k|v input (pack_attention_qkv)
`portable_equivalent` rewrites the cuda-only ops back into portable ones (the reference the tests check
the cuda target against, and a way to run a cuda-fused graph on a CPU).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, replace, dataclass
from pathlib import Path

import numpy as np

from edgeocr import artifact as af
from edgeocr.errors import EdgeOCRError

log = logging.getLogger("edgeocr.quantize")

FUSION_VERSION = 4            # 2: rope and gate_up passes, no SwiGLU (ORT 1.31 CUDA lacks it); 3: packed-QKV
                              # reshapes keep the batch (2 ran one slot only); 4: the vision GEMM passes (opt-in)
TARGETS = ("portable", "cuda")
MS = "com.microsoft"
_FLOAT, _FLOAT16 = 1, 10            # onnx.TensorProto element types


@dataclass(frozen=True)
class FuseOptions:
    target: str = "cuda"            # "portable" (every ONNX Runtime EP) or "cuda" (adds CUDA-EP-only ops)
    gqa_qk_norm: bool = True        # cuda: packed q|k|v, Q/K RMSNorm inside GroupQueryAttention
    attention_bias: bool = True     # vision: q|k|v bias into MultiHeadAttention (its bias input)
    vision_gemms: bool = False      # vision: q, k, v as three MatMuls (no Split); the patch Conv as a MatMul
    #                                 (opt-in: on an H100 vision 1.1 ms faster, but its ONNX Runtime
    #                                 InferenceSession 108 MiB larger at load: docs/perf.md section 17)

    def validate(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"fusion target must be one of {TARGETS}, not {self.target!r}")


# --------------------------------------------------------------------------------------------- helpers
def _onnx_model(model):
    """onnxruntime.transformers' OnnxModel around a ModelProto (its fusion classes import each other by bare
    module name, so the package directory has to be importable)."""
    try:
        import onnxruntime.transformers  # noqa: F401  (puts its directory on sys.path)
        from onnx_model import OnnxModel
    except ImportError as e:
        raise ValueError(f"graph fusion needs onnxruntime's transformers tools ({e}): pip install onnxruntime") from None
    return OnnxModel(model)


def op_counts(model) -> dict[str, int]:
    """{op_type: count} of a ModelProto's main graph (Constant nodes included)."""
    return dict(sorted(Counter(n.op_type for n in model.graph.node).items()))


def constants_to_initializers(model) -> int:
    """Constant nodes -> initializers of the same name (patterns then see one kind of constant)."""
    from onnx import numpy_helper

    keep, n = [], 0
    for node in model.graph.node:
        attr = {a.name: a for a in node.attribute}
        if node.op_type == "Constant" and not node.domain and "value" in attr:
            t = numpy_helper.from_array(numpy_helper.to_array(attr["value"].t), node.output[0])
            model.graph.initializer.append(t)
            n += 1
        else:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return n


COPY_ALIASES_UP_TO = 1 << 16      # bytes: an Identity alias of an initializer this small becomes a copy


def fold_identities(model) -> int:
    """Identity nodes (the exporter's way of sharing one initializer between equal weights, e.g. norm weights
    that are all ones) -> their consumers read the source directly.  An alias of an initializer of at most
    COPY_ALIASES_UP_TO bytes (a norm's weight) becomes a copy under the alias's own name instead, so every named
    weight of the exported graph keeps its name in the fused one (`quantize native-step` finds each layer's norms
    by name); a large one (a tied lm_head) stays shared."""
    from onnx import TensorProto, helper

    outputs = {o.name for o in model.graph.output}
    inits = {i.name: i for i in model.graph.initializer}
    alias = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Identity" and n.output[0] not in outputs}
    if not alias:
        return 0

    def root(x: str) -> str:
        while x in alias:
            x = alias[x]
        return x

    copied = set()
    for out in list(alias):
        src = inits.get(root(out))
        if src is None or out in inits:
            continue
        size = int(np.prod(src.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(src.data_type).itemsize
        if size <= COPY_ALIASES_UP_TO:
            t = TensorProto()
            t.CopyFrom(src)
            t.name = out
            model.graph.initializer.append(t)
            copied.add(out)
    folded = {k: root(v) for k, v in alias.items() if k not in copied}
    keep = [n for n in model.graph.node if not (n.op_type == "Identity" and n.output[0] in alias)]
    for n in keep:
        for i, x in enumerate(n.input):
            if x in folded:
                n.input[i] = folded[x]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return len(alias)


def _const(om, name: str):
    """Value of an initializer, or None."""
    from onnx import numpy_helper

    t = om.get_initializer(name) if name else None
    return None if t is None else numpy_helper.to_array(t)


def _is_scalar(om, name: str, value: float, tol: float = 1e-6) -> bool:
    v = _const(om, name)
    return v is not None and v.size == 1 and abs(float(v.reshape(-1)[0]) - value) <= tol


def _attr(node, name: str, default=None):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


# ops ONNX Runtime registers in the default ONNX domain that onnx's checker has no schema for
ORT_ONNX_DOMAIN_OPS = ("SimplifiedLayerNormalization",)


def save_graph(model, path: Path) -> None:
    """quantize.export's save (weights in `<name>.data` beside the graph), with onnx's checker run only where
    it knows every default-domain op: it has no schema for ONNX Runtime's SimplifiedLayerNormalization."""
    import onnx

    from quantize.export import IR_VERSION

    model.ir_version = IR_VERSION
    data = path.name + ".data"
    for p in (path, path.with_name(data)):
        if p.exists():
            p.unlink()
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data,
                    size_threshold=1024)
    if not any(n.op_type in ORT_ONNX_DOMAIN_OPS and n.domain in ("", "ai.onnx") for n in model.graph.node):
        onnx.checker.check_model(str(path))


def load_graph(path: Path):
    """An ONNX graph with its external weights, read here rather than by onnx.load: onnx (>= 1.17) refuses a data
    file with more than one hard link, and `quantize reslot` hard-links an artifact's files into the new one."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    files: dict[str, bytes] = {}
    for t in _get_all_tensors(model):
        if not uses_external_data(t):
            continue
        info = ExternalDataInfo(t)
        loc = Path(info.location)
        if loc.is_absolute() or ".." in loc.parts or not (path.parent / loc).is_file():
            raise ValueError(f"{path}: tensor {t.name!r} points outside the artifact or at a missing file "
                             f"({info.location!r})")
        if info.location not in files:
            files[info.location] = (path.parent / loc).read_bytes()
        blob = files[info.location]
        start = info.offset or 0
        end = len(blob) if info.length is None else start + info.length
        if end > len(blob):
            raise ValueError(f"{path}: tensor {t.name!r} reads past the end of {info.location}")
        t.raw_data = blob[start:end]
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
    return model


def _opset(model) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _parent(out2node: dict, name: str, op_type: str | None = None):
    node = out2node.get(name)
    return node if node is not None and (op_type is None or node.op_type == op_type) else None


def _init(om, array: np.ndarray, name: str) -> str:
    from onnx import numpy_helper

    if om.get_initializer(name) is None:
        om.add_initializer(numpy_helper.from_array(np.ascontiguousarray(array), name))
    return name


def _finish(om) -> None:
    """Drop what no output needs, then order the nodes."""
    om.prune_graph(allow_remove_graph_inputs=False)
    om.topological_sort()


# --------------------------------------------------------------------------------------------- portable passes
def fuse_rms_norms(om) -> int:
    """x -> [Cast fp32] -> Pow(2) -> ReduceMean(-1) -> Add(eps) -> Sqrt -> Div(1, .) -> Mul(x, .) -> [Cast] ->
    Mul(w) becomes SimplifiedLayerNormalization(x, w) (statistics in fp32, stash_type 1).  The casts are the
    export's fp32-statistics wrapper around an fp16 norm; the fused op computes in fp32 whatever its input."""
    from onnx import helper

    out2node, in2nodes = om.output_name_to_node(), om.input_name_to_nodes()
    n = 0
    for mul_w in list(om.get_nodes_by_op_type("Mul")):
        w_at = [i for i, x in enumerate(mul_w.input) if (v := _const(om, x)) is not None and v.ndim == 1]
        if len(w_at) != 1:
            continue
        norm_in = mul_w.input[1 - w_at[0]]
        cast_out = _parent(out2node, norm_in, "Cast")
        mul_x = _parent(out2node, cast_out.input[0] if cast_out else norm_in, "Mul")
        if mul_x is None:
            continue
        div = next((p for i in (0, 1) if (p := _parent(out2node, mul_x.input[i], "Div"))), None)
        if div is None or not _is_scalar(om, div.input[0], 1.0):
            continue
        xf = mul_x.input[1] if mul_x.input[0] == div.output[0] else mul_x.input[0]
        sqrt = _parent(out2node, div.input[1], "Sqrt")
        add = sqrt and _parent(out2node, sqrt.input[0], "Add")
        if not add:
            continue
        rm = next((p for i in (0, 1) if (p := _parent(out2node, add.input[i], "ReduceMean"))), None)
        eps = _const(om, add.input[1] if rm and add.input[0] == rm.output[0] else add.input[0])
        pow_ = rm and _parent(out2node, rm.input[0], "Pow")
        if not pow_ or pow_.input[0] != xf or not _is_scalar(om, pow_.input[1], 2.0) or eps is None or eps.size != 1:
            continue
        axes = _attr(rm, "axes") or (list(_const(om, rm.input[1])) if len(rm.input) > 1 else None)
        if list(axes or []) != [-1] or _attr(rm, "keepdims", 1) != 1:
            continue
        cast_in = _parent(out2node, xf, "Cast")
        w_type = om.get_initializer(mul_w.input[w_at[0]]).data_type
        if cast_out is not None and cast_in is None:    # fp32 graph: only the no-op cast back was exported
            if w_type != _FLOAT or _attr(cast_out, "to") != _FLOAT:
                continue
            x = xf
        elif cast_out is not None:      # fp32-statistics wrapper: both casts go, the op reads x itself
            if _attr(cast_in, "to") != _FLOAT or _attr(cast_out, "to") != w_type:
                continue
            x = cast_in.input[0]
        else:
            x = xf
        pattern = [mul_w, mul_x, div, sqrt, add, rm, pow_] + ([cast_out] if cast_out is not None else [])
        if cast_out is not None and cast_in is not None and \
                {id(u) for u in in2nodes.get(xf, [])} <= {id(pow_), id(mul_x)}:
            pattern.append(cast_in)         # else the cast stays for its other readers (an fp32 residual)
        if not om.is_safe_to_fuse_nodes(pattern, [mul_w.output[0]], in2nodes, out2node):
            continue
        om.remove_nodes(pattern)
        om.add_node(helper.make_node("SimplifiedLayerNormalization", [x, mul_w.input[w_at[0]]], [mul_w.output[0]],
                                     name=mul_w.name + "_rms_norm", axis=-1, epsilon=float(eps.reshape(-1)[0]),
                                     stash_type=1))
        n += 1
        out2node, in2nodes = om.output_name_to_node(), om.input_name_to_nodes()
    return n


def fuse_skip_norms(om, simplified: bool) -> int:
    """Residual Add + (Simplified)LayerNormalization -> Skip(Simplified)LayerNormalization, the Add's sum kept as
    the op's fourth output where the residual stream goes on.  onnxruntime.transformers' fusion, without its
    symbolic shape inference: every residual Add here adds two activations of one shape (an Add with a
    constant operand, such as the vision position table, is never fused)."""
    from fusion_skiplayernorm import FusionSkipLayerNormalization

    op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    before = len(om.get_nodes_by_op_type(op))
    FusionSkipLayerNormalization(om, op, "SimplifiedLayerNormalization" if simplified else "LayerNormalization",
                                 shape_infer=False).apply()
    return len(om.get_nodes_by_op_type(op)) - before


def fold_skip_norm_bias(om) -> int:
    """A projection's bias Add feeding either input of Skip(Simplified)LayerNormalization -> the op's bias input.
    (onnxruntime.transformers' FusionBiasSkipLayerNormalization covers SkipLayerNormalization only, and only
    when the first Add it meets is the biased one: it misses the first layer, whose residual is an Add too.)"""
    out2node, in2nodes = om.output_name_to_node(), om.input_name_to_nodes()
    n = 0
    for node in om.get_nodes_by_op_type("SkipLayerNormalization") + om.get_nodes_by_op_type(
            "SkipSimplifiedLayerNormalization"):
        bias_slot = 4 if node.op_type == "SkipLayerNormalization" else 3
        if len(node.input) > bias_slot and node.input[bias_slot]:
            continue
        for i in (0, 1):
            add = _parent(out2node, node.input[i], "Add")
            if add is None or len(in2nodes.get(add.output[0], [])) != 1:
                continue
            b_at = [j for j, x in enumerate(add.input) if (v := _const(om, x)) is not None and v.ndim == 1]
            if len(b_at) != 1 or _parent(out2node, add.input[1 - b_at[0]], "MatMul") is None:
                continue
            while len(node.input) < bias_slot:
                node.input.append("")
            node.input[i] = add.input[1 - b_at[0]]
            node.input.append(add.input[b_at[0]])
            om.remove_node(add)
            n += 1
            break
    return n


def fold_layer_norm_casts(om) -> int:
    """Cast(-> fp32) -> LayerNormalization(fp32 weights) -> Cast(-> T) becomes one LayerNormalization on the
    T tensor with T weights (for fp16 exactly the exported fp16 parameters) and fp32 statistics (stash_type 1):
    two cast kernels fewer, and a SkipLayerNormalization can take its place."""
    from onnx import helper

    out2node, in2nodes = om.output_name_to_node(), om.input_name_to_nodes()
    n = 0
    for ln in list(om.get_nodes_by_op_type("LayerNormalization")):
        c1 = _parent(out2node, ln.input[0], "Cast")
        users = in2nodes.get(ln.output[0], [])
        if c1 is None or _attr(c1, "to") != _FLOAT or len(users) != 1 or users[0].op_type != "Cast" \
                or _attr(users[0], "to") not in (_FLOAT, _FLOAT16) or len(ln.input) != 3:
            continue
        w, b = _const(om, ln.input[1]), _const(om, ln.input[2])
        if w is None or b is None:
            continue
        c2 = users[0]
        dt, tag = (np.float16, "_fp16") if _attr(c2, "to") == _FLOAT16 else (np.float32, "")
        wt = _init(om, w.astype(dt), ln.input[1] + tag)
        bt = _init(om, b.astype(dt), ln.input[2] + tag)
        om.remove_nodes([ln, c2])
        om.add_node(helper.make_node("LayerNormalization", [c1.input[0], wt, bt], [c2.output[0]], name=ln.name,
                                     axis=_attr(ln, "axis", -1), epsilon=_attr(ln, "epsilon", 1e-5), stash_type=1))
        n += 1
        out2node, in2nodes = om.output_name_to_node(), om.input_name_to_nodes()
    return n


def fuse_gelu(om) -> tuple[int, int]:
    """erf GELU -> Gelu, then the projection's bias Add + Gelu -> BiasGelu (onnxruntime.transformers' fusions)."""
    from fusion_biasgelu import FusionBiasGelu
    from fusion_gelu import FusionGelu

    FusionGelu(om).apply()
    gelu = len(om.get_nodes_by_op_type("Gelu"))
    FusionBiasGelu(om, is_fastgelu=False).apply()
    return gelu, len(om.get_nodes_by_op_type("BiasGelu"))


def fold_attention_bias(om) -> int:
    """MatMul -> Add(bias[3C]) -> Split(3) -> MultiHeadAttention(q, k, v) becomes MatMul -> Split ->
    MultiHeadAttention(q, k, v, bias): the op adds the bias where it reads q, k and v."""
    out2node, in2nodes = om.output_name_to_node(), om.input_name_to_nodes()
    n = 0
    for mha in om.get_nodes_by_op_type("MultiHeadAttention"):
        if len(mha.input) != 3 or not all(mha.input):
            continue
        split = _parent(out2node, mha.input[0], "Split")
        if split is None or list(split.output) != list(mha.input):
            continue
        add = _parent(out2node, split.input[0], "Add")
        if add is None or len(in2nodes.get(add.output[0], [])) != 1:
            continue
        bias_at = [i for i, x in enumerate(add.input) if (v := _const(om, x)) is not None and v.ndim == 1]
        if len(bias_at) != 1 or _parent(out2node, add.input[1 - bias_at[0]], "MatMul") is None:
            continue
        split.input[0] = add.input[1 - bias_at[0]]
        mha.input.append(add.input[bias_at[0]])
        om.remove_node(add)
        n += 1
    return n


def _column_matmuls(om, mm, w: np.ndarray, blocks: list[tuple[str, str, int, int, str]]) -> list:
    """MatMul `mm` (x @ w) as one MatMul per column block of w: blocks are (weight suffix, node suffix, first
    column, end column, output name); the same bytes read, no kernel to cut its output apart."""
    from onnx import helper

    return [helper.make_node("MatMul", [mm.input[0], _init(om, w[:, a:b], f"{mm.input[1]}_{wname}")], [out],
                             name=f"{mm.name}_{nname}") for wname, nname, a, b, out in blocks]


def _qkv_projection(om, mha, out2node: dict, in2nodes: dict):
    """For MultiHeadAttention `mha` fed by MatMul(x, W[C, 3C]) -> Split(q, k, v) (on the last axis, constant sizes,
    the MatMul read by the Split alone): (matmul, split, W, sizes); else None."""
    if len(mha.input) < 3 or not all(mha.input[:3]):
        return None
    split = _parent(out2node, mha.input[0], "Split")
    if split is None or list(split.output) != list(mha.input[:3]) or _attr(split, "axis", 0) not in (-1, 2):
        return None
    mm = _parent(out2node, split.input[0], "MatMul")
    w = None if mm is None else _const(om, mm.input[1])
    if w is None or w.ndim != 2 or len(in2nodes.get(mm.output[0], [])) != 1:
        return None
    if len(split.input) > 1 and split.input[1]:
        sizes = _const(om, split.input[1])
        if sizes is None:                       # sizes computed in the graph: not matched
            return None
    else:
        sizes = _attr(split, "split")
    sizes = [w.shape[1] // 3] * 3 if sizes is None else [int(x) for x in np.asarray(sizes).reshape(-1)]
    if len(sizes) != 3 or sum(sizes) != w.shape[1]:
        return None
    return mm, split, w, sizes


def unpack_attention_qkv(om) -> int:
    """MatMul(x, W[C, 3C]) -> Split(q, k, v) -> MultiHeadAttention(q, k, v[, bias]) becomes three MatMuls over
    W's column blocks feeding the op directly: the same bytes read, no Split kernel (ONNX Runtime's
    _SplitSmallInnerKernel took 34 us a layer over the real vision graph's [4,096, 3,456] on an H100)."""

    out2node, in2nodes = om.output_name_to_node(), om.input_name_to_nodes()
    n = 0
    for mha in list(om.get_nodes_by_op_type("MultiHeadAttention")):
        found = _qkv_projection(om, mha, out2node, in2nodes)
        if found is None:
            continue
        mm, split, w, sizes = found
        ends = np.cumsum(sizes)
        blocks = [(part, part, int(e - k), int(e), out) for part, k, e, out in zip("qkv", sizes, ends, split.output)]
        om.remove_nodes([mm, split])
        om.add_nodes(_column_matmuls(om, mm, w, blocks))
        n += 1
        out2node, in2nodes = om.output_name_to_node(), om.input_name_to_nodes()
    return n


def pack_attention_qkv(om) -> int:
    """MatMul(x, W[C, 3C]) -> Split(q, k, v) -> MultiHeadAttention(q, k, v[, bias]) becomes one MatMul over W's
    columns reordered from [q|k|v, head, dim] to [head, q|k|v, dim] -> Reshape [B, S, heads, 3, dim] ->
    MultiHeadAttention(packed q|k|v[, bias]): its packed-QKV input, so that one kernel bias-adds and lays out q, k and
    v (three with `unpack_attention_qkv`) and one GEMM (one dequantization with 8-bit weights) computes them.  The
    bias keeps its [q|k|v] order (the op's layout for it in both forms)."""
    from onnx import helper

    out2node, in2nodes = om.output_name_to_node(), om.input_name_to_nodes()
    outputs = {o.name for o in om.model.graph.output}
    n = 0
    for mha in list(om.get_nodes_by_op_type("MultiHeadAttention")):
        found = _qkv_projection(om, mha, out2node, in2nodes)
        heads = _attr(mha, "num_heads")
        if found is None or heads is None:
            continue
        mm, split, w, sizes = found
        c = w.shape[1] // 3
        if sizes != [c] * 3 or c % heads:
            continue
        if len(mha.output) > 1 or any(len(mha.input) > i and mha.input[i] for i in (6, 7)):
            continue                        # past / present key and value: the packed input takes none
        if any(len(in2nodes.get(o, [])) != 1 or o in outputs for o in split.output):
            continue                        # q, k or v read elsewhere too
        d = c // heads
        perm = np.arange(3 * c).reshape(3, heads, d).transpose(1, 0, 2).reshape(-1)
        tag = mm.name or mha.name
        wp = _init(om, np.ascontiguousarray(w[:, perm]), f"{mm.input[1]}_packed_heads")
        shape = _init(om, np.array([0, 0, heads, 3, d], np.int64), f"{tag}_packed_qkv_shape")
        om.remove_nodes([mm, split])
        om.add_nodes([helper.make_node("MatMul", [mm.input[0], wp], [tag + "_qkv"], name=tag + "_qkv"),
                      helper.make_node("Reshape", [tag + "_qkv", shape], [tag + "_packed"], name=tag + "_packed")])
        rest = list(mha.input[3:])
        del mha.input[:]
        mha.input.extend([tag + "_packed", "", "", *rest])
        n += 1
        out2node, in2nodes = om.output_name_to_node(), om.input_name_to_nodes()
    return n


VISION_QKV = ("three", "packed")     # how the vision GEMM passes hand q, k and v to MultiHeadAttention


def _vision_gemm_passes(om, qkv: str = "three") -> dict[str, int]:
    if qkv not in VISION_QKV:
        raise ValueError(f"vision q|k|v layout must be one of {VISION_QKV}, not {qkv!r}")
    qkv_pass = unpack_attention_qkv if qkv == "three" else pack_attention_qkv
    return {"attention_qkv": qkv_pass(om), "patch_gemm": patch_conv_as_matmul(om)}


def vision_gemms(model, qkv: str = "three") -> dict[str, int]:
    """The vision GEMM passes (`--vision-gemms`) on a fused vision ModelProto, in place; {pass: rewrites}.  qkv:
    "three" (q, k and v as three MatMuls) or "packed" (one MatMul into MultiHeadAttention's packed input)."""
    constants_to_initializers(model)
    om = _onnx_model(model)
    done = _vision_gemm_passes(om, qkv)
    _finish(om)
    return done


def _input_dims(om, name: str) -> list[int] | None:
    """The static dims of graph input `name`, followed back through Casts; None where not known."""
    out2node = om.output_name_to_node()
    while (node := _parent(out2node, name, "Cast")) is not None:
        name = node.input[0]
    for i in om.model.graph.input:
        if i.name == name:
            dims = i.type.tensor_type.shape.dim
            return [d.dim_value if d.HasField("dim_value") else None for d in dims]
    return None


PATCH_MATMUL = "_patch_matmul"      # the patch embedding's MatMul node name ends so (quantize.weight_int8 keeps it)


def patch_conv_as_matmul(om) -> int:
    """The patch embedding, Conv(pixels [1, 3, S, S], W [C, 3, P, P], stride P) -> Reshape [1, C, N] ->
    Transpose [1, N, C], becomes Reshape [1, 3, G, P, G, P] -> Transpose [1, G, G, 3, P, P] -> Reshape
    [1, N, 3 P P] -> MatMul(W as [3 P P, C]) -> Add(bias): one GEMM instead of cuDNN's convolution over 3 input
    channels and its layout conversions (about 0.35 ms of the real vision graph on an H100)."""
    from onnx import helper

    in2nodes = om.input_name_to_nodes()
    n = 0
    for conv in list(om.get_nodes_by_op_type("Conv")):
        w = _const(om, conv.input[1])
        has_bias = len(conv.input) > 2 and bool(conv.input[2])
        if w is None or w.ndim != 4 or w.shape[2] != w.shape[3]:
            continue
        c, ci, p = w.shape[0], w.shape[1], w.shape[2]
        auto_pad = _attr(conv, "auto_pad", b"NOTSET")
        if (list(_attr(conv, "strides", [1, 1])) != [p, p] or list(_attr(conv, "kernel_shape", [p, p])) != [p, p]
                or any(_attr(conv, "pads", [0] * 4)) or _attr(conv, "group", 1) != 1
                or any(d != 1 for d in _attr(conv, "dilations", [1, 1])) or p == 1
                or (auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad) not in ("NOTSET", "VALID")):
            continue
        users = in2nodes.get(conv.output[0], [])
        rs = users[0] if len(users) == 1 and users[0].op_type == "Reshape" else None
        shape = None if rs is None else _const(om, rs.input[1])
        tusers = [] if rs is None else in2nodes.get(rs.output[0], [])
        tr = tusers[0] if len(tusers) == 1 and tusers[0].op_type == "Transpose" else None
        if shape is None or tr is None or list(_attr(tr, "perm", [])) != [0, 2, 1] or shape.size != 3:
            continue
        grid = int(round(np.sqrt(int(shape[2])))) if int(shape[2]) > 0 else 0
        if (int(shape[0]) != 1 or int(shape[1]) != c or grid == 0 or grid * grid != int(shape[2])
                or _input_dims(om, conv.input[0]) != [1, ci, grid * p, grid * p]):
            continue
        tag = conv.name or "patch_embed"
        k = _init(om, w.reshape(c, ci * p * p).T, f"{conv.input[1]}_as_matmul")
        s6 = _init(om, np.array([1, ci, grid, p, grid, p], np.int64), f"{tag}_patch_grid_shape")
        s3 = _init(om, np.array([1, grid * grid, ci * p * p], np.int64), f"{tag}_patch_rows_shape")
        nodes = [helper.make_node("Reshape", [conv.input[0], s6], [tag + "_grid"], name=tag + "_grid"),
                 helper.make_node("Transpose", [tag + "_grid"], [tag + "_patches"], name=tag + "_patches",
                                  perm=[0, 2, 4, 1, 3, 5]),
                 helper.make_node("Reshape", [tag + "_patches", s3], [tag + "_rows"], name=tag + "_rows")]
        if not has_bias:
            nodes.append(helper.make_node("MatMul", [tag + "_rows", k], [tr.output[0]], name=tag + PATCH_MATMUL))
        else:
            nodes += [helper.make_node("MatMul", [tag + "_rows", k], [tag + "_proj"], name=tag + PATCH_MATMUL),
                      helper.make_node("Add", [tag + "_proj", conv.input[2]], [tr.output[0]], name=tag + "_bias")]
        om.remove_nodes([conv, rs, tr])
        om.add_nodes(nodes)
        n += 1
        in2nodes = om.input_name_to_nodes()
    return n


def fuse_lm_head(om) -> int:
    """Transpose(x) -> MatMul(W[V, H], .) -> Transpose, how the export computes the tied lm_head without a
    transposed copy of the embedding table, becomes one Gemm(x, W, transB=1): two transpose kernels fewer."""
    from onnx import helper

    out2node, in2nodes = om.output_name_to_node(), om.input_name_to_nodes()
    n = 0
    for mm in list(om.get_nodes_by_op_type("MatMul")):
        w = _const(om, mm.input[0])
        t_in = _parent(out2node, mm.input[1], "Transpose")
        users = in2nodes.get(mm.output[0], [])
        if w is None or w.ndim != 2 or t_in is None or len(users) != 1 or users[0].op_type != "Transpose":
            continue
        t_out = users[0]
        if _attr(t_in, "perm") != [1, 0] or _attr(t_out, "perm") != [1, 0]:
            continue
        om.remove_nodes([mm, t_out] + ([t_in] if len(in2nodes.get(t_in.output[0], [])) == 1 else []))
        om.add_node(helper.make_node("Gemm", [t_in.input[0], mm.input[0]], [t_out.output[0]], name=mm.name + "_gemm",
                                     transB=1))
        n += 1
        out2node, in2nodes = om.output_name_to_node(), om.input_name_to_nodes()
    return n


# --------------------------------------------------------------------------------------------- cuda passes
def _packed_rope_tables(om, cos: str, sin: str, heads: int, rotated: int, dtype, cache: dict) -> tuple[str, str]:
    """cos/sin [B, S, 1, D] -> [B, S, heads, D] tables that rotate the first `rotated` heads and leave the rest
    (the value heads) as they are: cos 1, sin 0.  Built once per graph run, shared by every layer."""
    from onnx import helper

    if (cos, sin) in cache:
        return cache[(cos, sin)]
    mask = np.zeros((1, 1, heads, 1), dtype)
    mask[:, :, :rotated] = 1
    m = _init(om, mask, f"rope_rotated_heads_{heads}_{rotated}")
    keep = _init(om, (1 - mask).astype(dtype), f"rope_kept_heads_{heads}_{rotated}")
    tag = f"packed_rope_{len(cache)}"
    om.add_node(helper.make_node("Mul", [cos, m], [tag + "_cos_rotated"], name=tag + "_cos_mul"))
    om.add_node(helper.make_node("Add", [tag + "_cos_rotated", keep], [tag + "_cos"], name=tag + "_cos_add"))
    om.add_node(helper.make_node("Mul", [sin, m], [tag + "_sin"], name=tag + "_sin_mul"))
    cache[(cos, sin)] = (tag + "_cos", tag + "_sin")
    return cache[(cos, sin)]


def pack_gqa_qk_norm(om) -> int:
    """Per layer, as exported:  MatMul(qkv) -> Split(q|k, v) -> Reshape -> RoPE (Mul cos, MatMul R, Mul sin, Add)
    -> Split(q, k) -> SimplifiedLayerNormalization(qn) / (kn) -> Reshape -> GroupQueryAttention(q, k, v).
    Becomes:  MatMul(qkv) -> Reshape [B, S, H+2KVH, D] -> RoPE with packed tables -> Reshape ->
    GroupQueryAttention(packed qkv, q_norm_weight=qn, k_norm_weight=kn): both Splits, both norms and their
    reshapes gone.  The op normalizes q and k per head before its own (unused) rotary, i.e. after ours."""
    from onnx import helper

    out2node = om.output_name_to_node()
    tables: dict = {}
    n = 0
    for gqa in list(om.get_nodes_by_op_type("GroupQueryAttention")):
        if len(gqa.input) < 7 or not gqa.input[1] or not gqa.input[2]:
            continue
        nq, kvh = _attr(gqa, "num_heads"), _attr(gqa, "kv_num_heads")
        rq, rk = _parent(out2node, gqa.input[0], "Reshape"), _parent(out2node, gqa.input[1], "Reshape")
        sq = rq and _parent(out2node, rq.input[0], "SimplifiedLayerNormalization")
        sk = rk and _parent(out2node, rk.input[0], "SimplifiedLayerNormalization")
        split_qk = sq and sk and _parent(out2node, sq.input[0], "Split")
        if not split_qk or list(split_qk.output) != [sq.input[0], sk.input[0]]:
            continue
        eps = _attr(sq, "epsilon", 1e-5)
        if abs(_attr(sk, "epsilon", 1e-5) - eps) > 1e-12:
            continue
        add = _parent(out2node, split_qk.input[0], "Add")
        muls = [_parent(out2node, x, "Mul") for x in add.input] if add else []
        if len(muls) != 2 or not all(muls):
            continue
        rot = next((m for m in muls if _parent(out2node, m.input[0], "MatMul")), None)
        plain = muls[1] if rot is muls[0] else muls[0]
        mm_r = rot and _parent(out2node, rot.input[0], "MatMul")
        if not mm_r or plain.input[0] != mm_r.input[0] or _const(om, mm_r.input[1]) is None:
            continue
        x4 = _parent(out2node, plain.input[0], "Reshape")
        split_qkv = x4 and _parent(out2node, x4.input[0], "Split")
        if not split_qkv or split_qkv.output[0] != x4.input[0] or split_qkv.output[1] != gqa.input[2]:
            continue
        qkv = split_qkv.input[0]
        rmat = _const(om, mm_r.input[1])
        d = rmat.shape[0]
        heads = nq + 2 * kvh
        cos, sin = _packed_rope_tables(om, plain.input[1], rot.input[1], heads, nq + kvh, rmat.dtype, tables)
        tag = gqa.name + "_packed"
        shape4 = _init(om, np.array([0, -1, heads, d], np.int64), f"packed_qkv_shape4_{heads}_{d}")
        shape3 = _init(om, np.array([0, -1, heads * d], np.int64), f"packed_qkv_shape3_{heads}_{d}")
        nodes = [helper.make_node("Reshape", [qkv, shape4], [tag + "_4d"], name=tag + "_reshape4"),
                 helper.make_node("Mul", [tag + "_4d", cos], [tag + "_cos"], name=tag + "_rope_cos"),
                 helper.make_node("MatMul", [tag + "_4d", mm_r.input[1]], [tag + "_rot"], name=tag + "_rope_rot"),
                 helper.make_node("Mul", [tag + "_rot", sin], [tag + "_sin"], name=tag + "_rope_sin"),
                 helper.make_node("Add", [tag + "_cos", tag + "_sin"], [tag + "_roped"], name=tag + "_rope_add"),
                 helper.make_node("Reshape", [tag + "_roped", shape3], [tag + "_qkv"], name=tag + "_reshape3")]
        inputs = [tag + "_qkv", "", "", *gqa.input[3:7]] + [""] * 7 + [sq.input[1], sk.input[1]]
        attrs = {a.name: helper.get_attribute_value(a) for a in gqa.attribute}
        attrs["qk_norm_epsilon"] = float(eps)
        new = helper.make_node("GroupQueryAttention", inputs, list(gqa.output), name=gqa.name, domain=MS, **attrs)
        om.remove_node(gqa)
        om.add_nodes(nodes + [new])
        n += 1
    return n


def unpack_gate_up(om) -> int:
    """gate|up MatMul -> Slice(first half), Slice(second half) becomes two MatMuls over the two halves of the
    weight: the same bytes read, two slice kernels fewer per layer (ONNX Runtime 1.31's CUDA provider has no
    SwiGLU kernel, and Split copies its size tables to the device on every call).  The Sigmoid/Mul after it
    stay as exported: ONNX Runtime runs them as one QuickGelu and one Mul."""

    in2nodes = om.input_name_to_nodes()
    n = 0
    for mm in list(om.get_nodes_by_op_type("MatMul")):
        w = _const(om, mm.input[1])
        users = in2nodes.get(mm.output[0], [])
        slices = [u for u in users if u.op_type == "Slice"]
        if w is None or w.ndim != 2 or w.shape[1] % 2 or len(slices) != 2:
            continue
        bounds = _bound_arithmetic(om, [u for u in users if u.op_type != "Slice"], slices, in2nodes)
        if bounds is None:
            continue
        half = w.shape[1] // 2
        parts = {}
        for u in slices:
            if len(u.input) < 4 or (len(u.input) > 4 and not _is_scalar(om, u.input[4], 1)):
                continue
            axes = _const(om, u.input[3])
            if axes is None or axes.size != 1 or int(axes.reshape(-1)[0]) not in (-1, 2):
                continue
            start, end = (_const(om, x) for x in u.input[1:3])
            if start is not None and int(start.reshape(-1)[0]) == 0:
                parts[0] = u
            elif start is not None and int(start.reshape(-1)[0]) == half:
                parts[1] = u
            elif start is None:             # torch's chunk(2): [0, n/2) and [n/2, n) with n/2 computed in the graph
                parts[1] = u
        if len(parts) != 2:
            continue
        (_, e0), (s1, e1) = ((_const(om, x) for x in parts[k].input[1:3]) for k in (0, 1))
        halves = (e0 is not None and int(e0.reshape(-1)[0]) == half) or parts[0].input[2] == parts[1].input[1]
        tail = e1 is None or int(e1.reshape(-1)[0]) >= 2 * half
        if not (halves and tail and (s1 is None or int(s1.reshape(-1)[0]) == half)):
            continue
        blocks = [(("gate", "up")[k], str(k), k * half, (k + 1) * half, u.output[0]) for k, u in parts.items()]
        om.remove_nodes([mm, *parts.values(), *bounds])
        om.add_nodes(_column_matmuls(om, mm, w, blocks))
        n += 1
        in2nodes = om.input_name_to_nodes()
    return n


def _bound_arithmetic(om, roots: list, slices: list, in2nodes: dict) -> list | None:
    """The nodes from `roots` (Shape of the gate|up output) down to the slice bounds torch's chunk computes, when
    they feed nothing but those bounds (they go with the slices); None when they feed anything else."""
    outputs = {o.name for o in om.model.graph.output}
    seen, todo = {}, list(roots)
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        if node.op_type not in ("Shape", "Gather", "Slice", "Add", "Div", "Mul", "Sub", "Unsqueeze", "Concat", "Cast",
                                "Squeeze", "Reshape") or any(o in outputs for o in node.output):
            return None
        seen[id(node)] = node
        for o in node.output:
            for c in in2nodes.get(o, []):
                if any(c is s for s in slices):
                    if any(c.input[j] == o for j in (0, 3, 4) if j < len(c.input)):
                        return None
                else:
                    todo.append(c)
    return list(seen.values())


def _rotation_permutation(r: np.ndarray) -> np.ndarray | None:
    """For R with exactly one +-1 per row and per column (rotate_half as a matrix), the index i with
    (x * a) @ R == (x @ R) * a[i] for every x, a: a[i][d] = a[e] where R[d, e] != 0.  None otherwise."""
    if r.ndim != 2 or r.shape[0] != r.shape[1] or not np.all(np.isin(r, (-1, 0, 1))):
        return None
    nz = r != 0
    if not (nz.sum(0) == 1).all() or not (nz.sum(1) == 1).all():
        return None
    return np.argmax(nz, axis=1).astype(np.int64)            # row d -> its column e


def fuse_rope(om) -> int:
    """x*cos + (x @ R)*sin, RoPE as exported (Mul, MatMul, Mul, Add: four kernels per layer), becomes
    (x * [cos | sin']) @ [I; R] (one Mul, one MatMul): the cos/sin' table [.., 2, D] is built once per graph run
    and shared by every layer (sin' = sin permuted so that (x * sin') @ R == (x @ R) * sin).  The products are
    the same roundings as before and the MatMul adds exactly two of them per output, so the result is the
    exported one (FP32: bit for bit)."""
    from onnx import helper

    out2node = om.output_name_to_node()
    tables: dict = {}
    n = 0
    for add in list(om.get_nodes_by_op_type("Add")):
        muls = [_parent(out2node, x, "Mul") for x in add.input]
        if len(muls) != 2 or not all(muls):
            continue
        rot = next((m for m in muls if _parent(out2node, m.input[0], "MatMul")), None)
        plain = muls[1] if rot is muls[0] else muls[0]
        mm_r = rot and _parent(out2node, rot.input[0], "MatMul")
        r = mm_r and _const(om, mm_r.input[1])
        perm = None if r is None else _rotation_permutation(r)
        if perm is None or plain.input[0] != mm_r.input[0] or _const(om, plain.input[1]) is not None:
            continue
        x, cos, sin, d = plain.input[0], plain.input[1], rot.input[1], r.shape[0]
        if (cos, sin) not in tables:
            t = f"rope_table_{len(tables)}"
            ax = _init(om, np.array([-2], np.int64), "rope_axis_m2")
            idx = _init(om, perm, f"rope_sin_perm_{d}")
            om.add_nodes([helper.make_node("Gather", [sin, idx], [t + "_sinp"], name=t + "_sinp", axis=-1),
                          helper.make_node("Unsqueeze", [cos, ax], [t + "_c5"], name=t + "_c5"),
                          helper.make_node("Unsqueeze", [t + "_sinp", ax], [t + "_s5"], name=t + "_s5"),
                          helper.make_node("Concat", [t + "_c5", t + "_s5"], [t], name=t, axis=-2)])
            tables[(cos, sin)] = t
        k = _init(om, np.concatenate([np.eye(d, dtype=r.dtype), r]), f"rope_stack_{d}_{r.dtype.name}")
        ax = _init(om, np.array([-2], np.int64), "rope_axis_m2")
        flat = _init(om, np.array([0, 0, 0, -1], np.int64), "rope_pair_shape")
        tag = add.name + "_rope"
        nodes = [helper.make_node("Unsqueeze", [x, ax], [tag + "_x5"], name=tag + "_x5"),
                 helper.make_node("Mul", [tag + "_x5", tables[(cos, sin)]], [tag + "_prod"], name=tag + "_mul"),
                 helper.make_node("Reshape", [tag + "_prod", flat], [tag + "_pairs"], name=tag + "_pairs"),
                 helper.make_node("MatMul", [tag + "_pairs", k], [add.output[0]], name=tag + "_sum")]
        om.remove_nodes([add, plain, rot, mm_r])
        om.add_nodes(nodes)
        n += 1
        out2node = om.output_name_to_node()
    return n


def portable_equivalent(model):
    """The cuda-only ops of a fused graph rewritten with portable ones, in place: packed GroupQueryAttention with
    Q/K-norm weights -> Split, per-head SimplifiedLayerNormalization, GroupQueryAttention(q, k, v); MultiHeadAttention
    with packed q|k|v [B, S, N, 3, H] -> Split, Reshape, MultiHeadAttention(q, k, v).  Follows the ops' documented
    semantics; returns the number rewritten."""
    from onnx import helper

    om = _onnx_model(model)
    n = 0
    for gqa in list(om.get_nodes_by_op_type("GroupQueryAttention")):
        ins = list(gqa.input) + [""] * (16 - len(gqa.input))
        if len(gqa.input) < 16 or not ins[14]:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in gqa.attribute}
        eps = attrs.pop("qk_norm_epsilon", 1e-6)
        nq, kvh = attrs["num_heads"], attrs["kv_num_heads"]
        d = _const(om, ins[14]).shape[0]
        t = gqa.name + "_portable"
        sizes = _init(om, np.array([nq * d, kvh * d, kvh * d], np.int64), f"{t}_split_sizes")
        hq = _init(om, np.array([0, -1, nq, d], np.int64), f"{t}_q4_shape")
        hk = _init(om, np.array([0, -1, kvh, d], np.int64), f"{t}_k4_shape")
        fq = _init(om, np.array([0, -1, nq * d], np.int64), f"{t}_q3_shape")
        fk = _init(om, np.array([0, -1, kvh * d], np.int64), f"{t}_k3_shape")
        nodes = [helper.make_node("Split", [ins[0], sizes], [t + "_q", t + "_k", t + "_v"], axis=-1),
                 helper.make_node("Reshape", [t + "_q", hq], [t + "_q4"]),
                 helper.make_node("SimplifiedLayerNormalization", [t + "_q4", ins[14]], [t + "_qn"], axis=-1,
                                  epsilon=float(eps), stash_type=1),
                 helper.make_node("Reshape", [t + "_qn", fq], [t + "_q3"]),
                 helper.make_node("Reshape", [t + "_k", hk], [t + "_k4"]),
                 helper.make_node("SimplifiedLayerNormalization", [t + "_k4", ins[15]], [t + "_kn"], axis=-1,
                                  epsilon=float(eps), stash_type=1),
                 helper.make_node("Reshape", [t + "_kn", fk], [t + "_k3"]),
                 helper.make_node("GroupQueryAttention", [t + "_q3", t + "_k3", t + "_v", *ins[3:7]], list(gqa.output),
                                  name=gqa.name, domain=MS, **attrs)]
        om.remove_node(gqa)
        om.add_nodes(nodes)
        n += 1
    for mha in list(om.get_nodes_by_op_type("MultiHeadAttention")):     # packed q|k|v (pack_attention_qkv)
        ins = list(mha.input) + [""] * (3 - len(mha.input))
        if ins[1] or ins[2]:          # key and value absent: the query is packed q|k|v [B, S, N, 3, H]
            continue
        t = mha.name + "_portable"
        ones = _init(om, np.array([1, 1, 1], np.int64), f"{t}_qkv_sizes")
        flat = _init(om, np.array([0, 0, -1], np.int64), f"{t}_flat_shape")
        nodes = [helper.make_node("Split", [ins[0], ones], [t + "_q5", t + "_k5", t + "_v5"], axis=3)]
        nodes += [helper.make_node("Reshape", [t + f"_{x}5", flat], [t + f"_{x}"]) for x in "qkv"]
        del mha.input[:]
        mha.input.extend([t + "_q", t + "_k", t + "_v", *ins[3:]])
        om.add_nodes(nodes)
        n += 1
    om.topological_sort()
    return n


# --------------------------------------------------------------------------------------------- graphs
def fuse_decoder(model, opts: FuseOptions = FuseOptions()) -> dict[str, int]:
    """Fuse an exported decoder ModelProto in place; returns {pass: fusions applied}."""
    opts.validate()
    constants_to_initializers(model)
    fold_identities(model)
    om = _onnx_model(model)
    done = {"rms_norm": fuse_rms_norms(om)}
    if opts.target == "cuda" and opts.gqa_qk_norm:
        done["gqa_qk_norm"] = pack_gqa_qk_norm(om)
        _finish(om)
    done["rope"] = fuse_rope(om)
    done["skip_rms_norm"] = fuse_skip_norms(om, simplified=True)
    done["lm_head"] = fuse_lm_head(om)
    done["gate_up"] = unpack_gate_up(om)
    _finish(om)
    return done


def fuse_vision(model, opts: FuseOptions = FuseOptions()) -> dict[str, int]:
    """Fuse an exported vision ModelProto in place; returns {pass: fusions applied}."""
    opts.validate()
    constants_to_initializers(model)
    fold_identities(model)
    om = _onnx_model(model)
    done = {"layer_norm_fp16": fold_layer_norm_casts(om), "rms_norm": fuse_rms_norms(om)}
    done["skip_layer_norm"] = fuse_skip_norms(om, simplified=False)
    done["skip_rms_norm"] = fuse_skip_norms(om, simplified=True)
    done["skip_norm_bias"] = fold_skip_norm_bias(om)
    done["gelu"], done["bias_gelu"] = fuse_gelu(om)
    if opts.attention_bias:
        done["attention_bias"] = fold_attention_bias(om)
    if opts.vision_gemms:
        done.update(_vision_gemm_passes(om))
    _finish(om)
    return done


GRAPH_FUSERS = {"decoder": fuse_decoder, "vision": fuse_vision}


def fuse_artifact(src: Path, out: Path, opts: FuseOptions = FuseOptions(),
                  progress: Callable[[str], None] | None = None) -> af.Artifact:
    """FP16 or FP32 artifact -> the same artifact with fused graphs (OUT may equal SRC: fused in place).

    Fuse before `quantize weight-int8`: the fusions match MatMul + bias patterns that MatMulNBits replaces."""
    from quantize.export import _file_table, _io, copy_unwritten

    opts.validate()
    say = progress or (lambda s: log.info("%s", s))
    t0 = time.perf_counter()
    src, out = Path(src), Path(out)
    m = af.read(src)
    if m.precision not in ("fp16", "fp32"):
        raise ValueError(f"{src} is {m.precision}: fuse an FP16 or FP32 artifact, then build weight-int8 from it")
    if "fusion" in m.export:
        raise ValueError(f"{src} is already fused ({m.export['fusion'].get('target')}); fuse the exported artifact")
    if m.decoder.attention != "gqa" and opts.target == "cuda" and opts.gqa_qk_norm:
        say("decoder uses masked attention: no GroupQueryAttention to pack (portable passes only there)")
    from quantize.export import prepare_out
    prepare_out(out)
    report = {"version": FUSION_VERSION, "target": opts.target, "options": asdict(opts), "graphs": {}}
    written = set()
    for name, fuser in GRAPH_FUSERS.items():
        g = getattr(m, name).file
        model = load_graph(src / g)
        before = op_counts(model)
        passes = fuser(model, opts)
        after = op_counts(model)
        save_graph(model, out / g)
        written |= {g, g + ".data"}
        report["graphs"][name] = {"passes": passes, "ops_before": before, "ops_after": after,
                                  "nodes_before": sum(before.values()), "nodes_after": sum(after.values())}
        say(f"{name}: {sum(before.values())} -> {sum(after.values())} nodes ("
            + ", ".join(f"{k} {v}" for k, v in passes.items() if v) + ")")
    if out.resolve() != src.resolve():
        copy_unwritten(src, out, m.files, written)
    dec = report["graphs"]["decoder"]
    report["cuda_only_ops"] = ["GroupQueryAttention q_norm_weight/k_norm_weight"] if dec["passes"].get("gqa_qk_norm") \
        else []
    report["seconds"] = round(time.perf_counter() - t0, 1)
    fused = m.derive(vision=replace(m.vision, **_io(out / m.vision.file)),
                     decoder=replace(m.decoder, **_io(out / m.decoder.file)),
                     files=_file_table(out), export=dict(m.export, fusion=report))
    af.write(out, fused)
    say(f"wrote {out} ({opts.target} fusions, {report['seconds']:.0f} s)")
    return fused


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m quantize.fuse", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifact", type=Path, help="exported FP16 or FP32 artifact directory")
    ap.add_argument("out", type=Path, help="fused artifact directory to write (may equal ARTIFACT)")
    ap.add_argument("--target", choices=TARGETS, default="cuda",
                    help="cuda (default): also ops only ONNX Runtime's CUDA EP runs; portable: runs on every EP")
    ap.add_argument("--no-gqa-qk-norm", action="store_true",
                    help="cuda target: keep q|k|v split and the Q/K norms outside GroupQueryAttention")
    ap.add_argument("--no-attention-bias", action="store_true",
                    help="vision: keep the q|k|v bias Add in front of MultiHeadAttention")
    ap.add_argument("--vision-gemms", action="store_true",
                    help="vision: q, k, v as three MatMuls (no Split) and the patch embedding's Conv as a MatMul "
                         "(faster vision, more device memory: docs/perf.md)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("onnxruntime.transformers").setLevel(logging.WARNING)
    try:
        fuse_artifact(a.artifact, a.out, FuseOptions(target=a.target,
                                                     gqa_qk_norm=not a.no_gqa_qk_norm,
                                                     attention_bias=not a.no_attention_bias,
                                                     vision_gemms=a.vision_gemms))
    except (ValueError, EdgeOCRError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
