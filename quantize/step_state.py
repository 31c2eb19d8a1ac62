"""Device-resident step state: a decoder graph whose decode step reads its per-step state from device buffers
and writes the next step's state itself, so a step needs no host-to-device copy.

    python -m quantize step-state ARTIFACT OUT

For an artifact exported with `--attention gqa --select-on-device` (fused or not, FP16 or FP32, weight-INT8 too).
Today's step writes, from the host, every slot's token id, its cos/sin rows, its length and one `seen` flag per
live slot.  This pass moves all of that into the graph:

    positions [B] int64      the cache row of each slot's incoming token (= seqlens_k, which is now derived:
                             Cast to int32); the prefill binds its prompt's last row, S - 1
    cos/sin                  rows of the text RoPE table [cache_len, D], stored as initializers and gathered at
                             `positions` when `rope_from_table` [1] bool is set (a decode step); the prefill binds
                             it false and passes its prompt's XD-RoPE tables as before (a generated token's
                             XD-RoPE row is the same on every page: all four position axes equal its row,
                             edgeocr.rope.text_table)
    seen_next [B, V]         `seen` with each slot's incoming token marked (ScatterElements), which the penalty
                             then reads; a new output
    positions_next [B]       positions + live (live [B] int64: 1 for a decoding slot, 0 for an idle one, whose
                             row then stays put); a new output
    next_token [B]           unchanged; the runtime binds it as the next step's input_ids

The runtime (edgeocr.backends.ort_step_state) keeps two sets of these buffers and alternates between two fixed
bindings (ping-pong: no output aliases an input of the same run), one CUDA graph each.  The host writes them only
when a page is admitted or leaves; `total_sequence_length` (GroupQueryAttention reads it from host memory) is a
host scalar bound once, the cache length.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from edgeocr import artifact as af
from edgeocr import rope
from edgeocr.errors import EdgeOCRError

log = logging.getLogger("edgeocr.quantize")

STEP_STATE_VERSION = 1
# the graph's new inputs and outputs (names the runtime binds)
POSITIONS, LIVE, ROPE_FROM_TABLE = "positions", "live", "rope_from_table"
POSITIONS_NEXT, SEEN_NEXT = "positions_next", "seen_next"
_PREFIX = "step_state_"


def _value_info(name: str, elem_type: int, shape: list):
    from onnx import helper
    return helper.make_tensor_value_info(name, elem_type, shape)


def add_step_state(model, table_cos: np.ndarray, table_sin: np.ndarray) -> dict[str, int]:
    """Rewrite a GroupQueryAttention + in-graph-selection decoder ModelProto in place (see module doc).
    table_cos/sin: [cache_len, D] float32, the text RoPE rows.  Returns what was rewired."""
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    inputs = {i.name: i for i in g.input}
    outputs = {o.name for o in g.output}
    need = {"input_ids", "cos", "sin", "seen", "penalty", "seqlens_k", "total_sequence_length"}
    missing = sorted(need - set(inputs)) + sorted({"next_token"} - outputs)
    if missing:
        raise ValueError(f"the decoder graph has no {', '.join(missing)}: step state needs a decoder exported with "
                         "--attention gqa --select-on-device")
    if POSITIONS in inputs:
        raise ValueError("the decoder graph already has device-resident step state")
    d = inputs["cos"].type.tensor_type.shape.dim[-1].dim_value
    if table_cos.shape != table_sin.shape or table_cos.ndim != 2 or table_cos.shape[1] != d:
        raise ValueError(f"RoPE tables {table_cos.shape} do not match the graph's head_dim {d}")
    seen_type = inputs["seen"].type.tensor_type.elem_type

    # every reader of cos/sin/seen now reads the rewritten tensor
    renamed = {"cos": _PREFIX + "cos", "sin": _PREFIX + "sin", "seen": SEEN_NEXT}
    rewired = {k: 0 for k in renamed}
    for node in g.node:
        for i, x in enumerate(node.input):
            if x in renamed:
                node.input[i] = renamed[x]
                rewired[x] += 1
    if not all(rewired.values()):
        raise ValueError(f"the decoder graph does not read {[k for k, v in rewired.items() if not v]}")

    g.initializer.extend([numpy_helper.from_array(np.ascontiguousarray(table_cos, np.float32), _PREFIX + "table_cos"),
                          numpy_helper.from_array(np.ascontiguousarray(table_sin, np.float32), _PREFIX + "table_sin"),
                          numpy_helper.from_array(np.array([-1, 1], np.int64), _PREFIX + "column")])
    one = numpy_helper.from_array(np.ones((1,), helper.tensor_dtype_to_np_dtype(seen_type)), _PREFIX + "one_seen")
    p = _PREFIX
    nodes = [
        # seqlens_k (total length - 1) is the incoming token's row
        helper.make_node("Cast", [POSITIONS], ["seqlens_k"], name=p + "seqlens_k", to=TensorProto.INT32),
        # a decode step's cos/sin: the table's row at `positions`, [B, 1, D]; the prefill's: its input
        helper.make_node("Reshape", [POSITIONS, p + "column"], [p + "rows"], name=p + "rows"),
        helper.make_node("Gather", [p + "table_cos", p + "rows"], [p + "cos_row"], name=p + "cos_row", axis=0),
        helper.make_node("Gather", [p + "table_sin", p + "rows"], [p + "sin_row"], name=p + "sin_row", axis=0),
        helper.make_node("Where", [ROPE_FROM_TABLE, p + "cos_row", "cos"], [p + "cos"], name=p + "cos"),
        helper.make_node("Where", [ROPE_FROM_TABLE, p + "sin_row", "sin"], [p + "sin"], name=p + "sin"),
        # the incoming tokens join their slots' seen sets before the penalty reads them
        helper.make_node("Shape", ["input_ids"], [p + "ids_shape"], name=p + "ids_shape"),
        helper.make_node("ConstantOfShape", [p + "ids_shape"], [p + "ones"], name=p + "ones", value=one),
        helper.make_node("ScatterElements", ["seen", "input_ids", p + "ones"], [SEEN_NEXT], name=p + "seen", axis=1),
        # the next step's rows: idle slots (live 0) stay where they are
        helper.make_node("Add", [POSITIONS, LIVE], [POSITIONS_NEXT], name=p + "positions_next"),
    ]
    g.node.extend(nodes)

    keep = [i for i in g.input if i.name != "seqlens_k"]
    del g.input[:]
    g.input.extend(keep + [_value_info(POSITIONS, TensorProto.INT64, ["batch"]),
                           _value_info(LIVE, TensorProto.INT64, ["batch"]),
                           _value_info(ROPE_FROM_TABLE, TensorProto.BOOL, [1])])
    vocab = inputs["seen"].type.tensor_type.shape.dim[-1].dim_value
    g.output.extend([_value_info(POSITIONS_NEXT, TensorProto.INT64, ["batch"]),
                     _value_info(SEEN_NEXT, seen_type, ["batch", vocab])])
    _topological_sort(model)
    return {f"{k}_readers": v for k, v in rewired.items()} | {"nodes_added": len(nodes)}


def _topological_sort(model) -> None:
    from quantize.fuse import _onnx_model
    _onnx_model(model).topological_sort()


def step_state_artifact(src: Path, out: Path, progress=None) -> af.Artifact:
    """A GQA + in-graph-selection artifact -> the same artifact whose decoder holds its step state (see module
    doc).  Vision graph and tokenizer are copied (not hard-linked: onnx refuses to load a weights file with several
    links, so a hard link would break `quantize weight-int8` of either artifact); OUT must differ from SRC."""
    from quantize.export import _file_table, _io, copy_unwritten
    from quantize.fuse import load_graph, op_counts, save_graph

    say = progress or (lambda s: log.info("%s", s))
    t0 = time.perf_counter()
    src, out = Path(src), Path(out)
    m = af.read(src)
    if m.decoder.attention != "gqa" or not m.decoder.select_on_device:
        raise ValueError(f"{src}: device-resident step state needs a decoder exported with --attention gqa "
                         f"--select-on-device (this one: attention {m.decoder.attention}, selection "
                         f"{'in graph' if m.decoder.select_on_device else 'on the host'})")
    if m.decoder.step_state:
        raise ValueError(f"{src} already holds its step state on the device")
    if m.decoder.native_step:
        raise ValueError(f"{src} has native-step weights, whose step keeps its state on the device already; make the "
                         "step-state artifact from the one native-step was made from")
    if out.resolve() == src.resolve():
        raise ValueError("OUT must differ from ARTIFACT")
    from quantize.export import prepare_out
    prepare_out(out)
    r = m.rope
    table_cos, table_sin = rope.text_table(m.cache_len, rope.inv_freq(r.head_dim, r.theta, r.alpha))
    model = load_graph(src / m.decoder.file)
    before = op_counts(model)
    done = add_step_state(model, table_cos, table_sin)
    save_graph(model, out / m.decoder.file)
    copy_unwritten(src, out, m.files, {m.decoder.file, m.decoder.file + ".data"})
    report = {"version": STEP_STATE_VERSION, "rewired": done, "ops_before": before, "ops_after": op_counts(model),
              "seconds": round(time.perf_counter() - t0, 1)}
    new = m.derive(decoder=replace(m.decoder, step_state=True, **_io(out / m.decoder.file)),
                   files=_file_table(out), export=dict(m.export, step_state=report),
                   source=dict(m.source, base_artifact=str(src.resolve())))
    af.write(out, new)
    say(f"wrote {out}: decoder with device-resident step state ({report['seconds']:.0f} s)")
    return new


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m quantize step-state", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifact", type=Path, help="artifact exported with --attention gqa --select-on-device")
    ap.add_argument("out", type=Path, help="artifact directory to write (not ARTIFACT)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        step_state_artifact(a.artifact, a.out)
    except (ValueError, EdgeOCRError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
