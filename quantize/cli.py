"""`python -m quantize`: the offline toolchain (needs the [export] extra: torch, transformers, onnx).

    python -m quantize export CHECKPOINT OUT [--precision fp32|fp16] [--cache-len N] [--slots N]
                                            [--rope-layout A|B] [--attention masked|gqa] [--select-on-device]
    python -m quantize int8 CHECKPOINT OUT [--calib DIR]       (calibrated W8A8, explicit Q/DQ)
    python -m quantize weight-int8 ARTIFACT OUT [--block-size 32] [--include-lm-head] [--decoder-only]
                                                [--target gpu|cpu] [--bits 8|4]
    python -m quantize fuse ARTIFACT OUT [--target cuda|portable]
    python -m quantize step-state ARTIFACT OUT     (gqa + in-graph selection: the decode step keeps its state on
                                                    the device, no host-to-device copy per step)
    python -m quantize native-step ARTIFACT OUT [--weights float|int8] [--vision float|int8] [--embedding float|int8]
                                         [--no-vision-gemms] [--vision-qkv three|packed]
                                                   (FP16 gqa + in-graph selection: the decoder's weights for the
                                                    runtime's own CUDA decode step, shared with the graph)
    python -m quantize reslot ARTIFACT OUT --slots N     (same graphs, another slot count; ONNX Runtime)
    python -m quantize tiny OUT [--config tiny-a|tiny-b] [--seed N]
    python -m quantize grow CHECKPOINT OUT [--text-layers N] [--vision-layers M] [--init copy|fresh] [--seed S]
                                   (a deeper checkpoint computing the same function: new layers
                                    with zeroed residual writers, spread between the old ones)
    python -m quantize average A B OUT [--weight W]   (the weighted mean of two checkpoints of one architecture)
    python -m quantize train ...       (the demo model's trainer: python -m quantize train --help)
    python -m quantize docgen ...      (the synthetic business-document generator)
    python -m quantize htmldocs OUT --count N --seed S [--workers W]   (HTML/CSS documents via headless Chromium)
    python -m quantize compare --reference hf:CHECKPOINT --candidate ARTIFACT --data DIR ...   (edgeocr check
                                                                     with transformers as a side)
    python -m quantize bench-hf ARTIFACT CHECKPOINT [--pages K] ...  (edgeocr bench beside transformers generate)
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from edgeocr.errors import EdgeOCRError


def _progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _print_sizes(m, out) -> None:
    for name, info in sorted(m.files.items()):
        print(f"{info['bytes'] / 2**20:10.2f} MiB  {name}")
    print(f"{sum(i['bytes'] for i in m.files.values()) / 2**20:10.2f} MiB  total -> {out}")


def _export_options(args, precision: str):
    from quantize.export import ExportOptions
    return ExportOptions(cache_len=args.cache_len, prefill_len=args.prefill_len, slots=args.slots,
                         rope_layout=args.rope_layout, precision=precision, device=args.device,
                         attention=args.attention, select_on_device=args.select_on_device)


_CALIB_DEFAULTS = (Path("calibration_data/calib"), Path(__file__).resolve().parents[1] / "calibration_data" / "calib")


def _int8(args) -> None:
    """Checkpoint -> FP32 export in a scratch directory -> calibrated INT8 artifact."""
    import shutil
    import tempfile

    from quantize.export import export
    from quantize.int8 import Int8Options, build_int8, calibration_images

    t0 = time.perf_counter()
    calib = args.calib or next((p for p in _CALIB_DEFAULTS if p.is_dir()), _CALIB_DEFAULTS[0])
    opts = Int8Options(calib_images=args.calib_images, holdout_images=args.holdout_images,
                       max_reverted=0 if args.no_sensitivity else Int8Options.max_reverted)
    calibration_images(calib, opts)           # before the export: a wrong folder costs nothing
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=args.out.parent, prefix=".fp32-"))
    try:
        export(args.checkpoint, work, _export_options(args, "fp32"), progress=_progress)
        m = build_int8(work, calib, args.out, opts, progress=_progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _print_sizes(m, args.out)
    _progress(f"int8 artifact built in {time.perf_counter() - t0:.0f} s")


def _grow(args) -> None:
    from quantize.grow import SHIPPED_LIMIT, GrowOptions, grow

    if args.seed is not None and args.init != "fresh":
        raise ValueError("--seed draws the layers of --init fresh; --init copy draws nothing")
    r = grow(args.checkpoint, args.out, GrowOptions(text_layers=args.text_layers, vision_layers=args.vision_layers,
                                                    init=args.init, seed=args.seed or 0), progress=_progress)
    mib = 2**20
    print(f"parameters      {r.params_before:>12,} -> {r.params_after:,}")
    print(f"safetensors     {r.weight_bytes_before / mib:>9.2f} MiB -> {r.weight_bytes_after / mib:.2f} MiB")
    for what, plan in (("decoder", r.text_plan), ("vision", r.vision_plan)):
        old = sum(i is not None for i in plan)
        print(f"{what + ' layers':<15} {old:>12} -> {len(plan)}   "
              + " ".join("+" if i is None else str(i) for i in plan) + "   (+ = new)")
    fits = "within" if r.disk_bytes_after <= SHIPPED_LIMIT else "OVER"
    print(f"{args.out} on disk: {r.disk_bytes_after / mib:.2f} MiB, {fits} the shipped model's "
          f"{SHIPPED_LIMIT / mib:.0f} MiB")


def _export_args(p) -> None:
    """What every checkpoint -> artifact command takes: shapes fixed at export, graph flavour."""
    p.add_argument("checkpoint", type=Path, help="Hugging Face HunyuanOCR checkpoint directory")
    p.add_argument("out", type=Path, help="artifact directory to write")
    p.add_argument("--cache-len", type=int, default=4096, help="static KV cache length per slot, tokens (default 4096)")
    p.add_argument("--prefill-len", type=int, default=2048, help="longest prompt, tokens (default 2048)")
    p.add_argument("--slots", type=int, default=1,
                   help="pages decoded at once: the decoder and KV cache hold this many sequences (default 1)")
    p.add_argument("--rope-layout", choices=["A", "B"], default="B",
                   help="XD-RoPE layout: B = transformers >= 5.13 (default), A = vLLM / Tencent training code")
    p.add_argument("--device", default="cpu", help="torch device used for tracing (cuda speeds up big models)")
    _graph_flavour_args(p)


def _graph_flavour_args(p) -> None:
    p.add_argument("--select-on-device", action="store_true",
                   help="repetition penalty + argmax inside the decoder graph: one token id read back per step")
    p.add_argument("--attention", choices=["masked", "gqa"], default="masked",
                   help="masked = portable ONNX ops (any runtime, TensorRT); gqa = ONNX Runtime's fused attention: "
                        "MultiHeadAttention in the vision graph, GroupQueryAttention in the decoder (cache "
                        "updated in place, reads the live length only)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m quantize", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="checkpoint -> FP32/FP16 ONNX artifact directory")
    _export_args(e)
    e.add_argument("--precision", choices=["fp32", "fp16"], default="fp32",
                   help="weights and activations (default %(default)s; fp16 for GPUs)")
    b = sub.add_parser("int8", help="checkpoint + calibration images -> calibrated INT8 artifact (explicit Q/DQ)")
    _export_args(b)
    b.add_argument("--calib", type=Path, default=None,
                   help="calibration images (default: calibration_data/calib here, else the source tree's)")
    b.add_argument("--calib-images", type=int, default=32,
                   help="images whose activations set the INT8 ranges (default %(default)s)")
    b.add_argument("--holdout-images", type=int, default=8,
                   help="further images the accuracy gate measures on (default %(default)s)")
    b.add_argument("--no-sensitivity", action="store_true",
                   help="measure the held-out gate but do not revert layers when it fails")
    w = sub.add_parser("weight-int8", help="FP16/FP32 artifact -> MatMul weights as 8-bit blocks (decoder, and vision unless --decoder-only) "
                       "(ONNX Runtime MatMulNBits: fewer bytes read per decoded token; no calibration)")
    w.add_argument("artifact", type=Path, help="the FP16/FP32 artifact directory to read")
    w.add_argument("out", type=Path, help="artifact directory to write")
    w.add_argument("--block-size", type=int, default=32, help="inputs sharing one scale (power of two >= 16)")
    w.add_argument("--include-lm-head", action="store_true",
                   help="also the (tied) lm_head, as a second INT8 copy of the embedding (slower on ORT 1.31 CUDA)")
    w.add_argument("--decoder-only", action="store_true",
                   help="keep the vision graph's weights as they are (by default they are stored in 8 bits too)")
    w.add_argument("--target", choices=["gpu", "cpu"], default="gpu",
                   help="cpu: from an FP32 artifact, lm_head included, integer accumulation (MatMulNBits "
                        "accuracy_level 4; vision: int8 MatMulInteger, activations quantized at run time), the "
                        "flavour for ONNX Runtime's CPU provider (docs/int8.md)")
    w.add_argument("--bits", type=int, choices=[8, 4], default=8, help="weight bits (4: smaller, less exact)")
    f = sub.add_parser("fuse", help="artifact -> the same artifact with fused ONNX Runtime graphs (fewer kernels "
                       "per decode step and per vision call; run before weight-int8)")
    f.add_argument("artifact", type=Path, help="the exported artifact directory to read")
    f.add_argument("out", type=Path, help="fused artifact directory (may equal ARTIFACT)")
    f.add_argument("--target", choices=["cuda", "portable"], default="cuda",
                   help="cuda (default): also ops only ONNX Runtime's CUDA EP runs; portable: every EP, CPU included")
    f.add_argument("--no-gqa-qk-norm", action="store_true",
                   help="cuda target: keep q|k|v split and the Q/K norms outside GroupQueryAttention")
    f.add_argument("--no-attention-bias", action="store_true",
                   help="vision: keep the q|k|v bias Add in front of MultiHeadAttention")
    f.add_argument("--vision-gemms", action="store_true",
                   help="vision: q, k, v as three MatMuls (no Split) and the patch embedding's Conv as a MatMul "
                        "(faster vision, more device memory: docs/perf.md)")
    ss = sub.add_parser("step-state", help="gqa + in-graph-selection artifact -> the same artifact whose decode "
                        "step reads and advances its own state in device buffers (no host-to-device copy a step)")
    ss.add_argument("artifact", type=Path, help="the artifact directory to read")
    ss.add_argument("out", type=Path, help="artifact directory to write (not ARTIFACT)")
    ns = sub.add_parser("native-step", help="gqa + in-graph-selection artifact -> the same artifact with its "
                        "decoder weights in the layout of edgeocr's own CUDA decode step, read by the graph as inputs")
    ns.add_argument("artifact", type=Path, help="the FP16 artifact directory to read, fused or not (FP32: the "
                    "CPU's numpy twins only; on CUDA an FP32 artifact steps on ONNX Runtime)")
    ns.add_argument("out", type=Path, help="artifact directory to write (not ARTIFACT)")
    ns.add_argument("--weights", choices=["float", "int8"], default="float",
                    help="int8: the layers' projections as 8-bit blocks of 32 (half their bytes), and by default the "
                         "embedding and lm_head too (--embedding)")
    ns.add_argument("--vision", choices=["float", "int8"], default=None,
                    help="the vision graph's MatMul weights: int8 as 8-bit blocks of 32 (half their bytes; the "
                         "default with --weights int8) or float as they are (the default otherwise)")
    ns.add_argument("--no-vision-gemms", action="store_true",
                    help="with 8-bit vision weights: keep the fused vision graph's q|k|v Split and patch Conv (by "
                         "default they become MatMuls before quantization, as `fuse --vision-gemms` does: faster "
                         "vision at no memory cost with 8-bit weights, docs/perf.md section 18)")
    ns.add_argument("--vision-qkv", choices=["three", "packed"], default=None,
                    help="with the vision GEMM passes: q, k and v as one MatMul into MultiHeadAttention's packed "
                         "q|k|v input (one GEMM and one bias-and-layout kernel a layer instead of three; CUDA only: "
                         "the default for an artifact fused with --target cuda and its GroupQueryAttention norms) "
                         "or as three MatMuls (the default otherwise)")
    ns.add_argument("--embedding", choices=["float", "int8"], default=None,
                    help="int8 (the default with --weights int8): the embedding (the tied lm_head; an untied lm_head "
                         "too) as 8-bit blocks of 32, read by the prefill through GatherBlockQuantized and "
                         "MatMulNBits and by the native step's 8-bit kernels (236 MiB -> 125 MiB on the real "
                         "decoder); float keeps it in the artifact's precision (the default otherwise)")
    rs = sub.add_parser("reslot", help="artifact -> the same graphs with another slot count (the decoder takes "
                        "any batch; ONNX Runtime flavours; TensorRT engines must be rebuilt)")
    rs.add_argument("artifact", type=Path, help="the artifact directory to read")
    rs.add_argument("out", type=Path, help="artifact directory to write")
    rs.add_argument("--slots", type=int, required=True, help="pages decoded at once")
    t = sub.add_parser("tiny", help="make a tiny random-weight HunyuanVL checkpoint (tests, demos)")
    t.add_argument("out", type=Path, help="checkpoint directory to write")
    t.add_argument("--config", choices=["tiny-a", "tiny-b"], default="tiny-a")
    t.add_argument("--seed", type=int, default=0)
    gr = sub.add_parser("grow", help="checkpoint -> a deeper checkpoint that computes exactly the same function "
                        "(new layers copy a neighbour, their output projections zeroed), to train further")
    gr.add_argument("checkpoint", type=Path, help="Hugging Face HunyuanVL checkpoint directory to read (SRC)")
    gr.add_argument("out", type=Path, help="new or empty checkpoint directory to write")
    gr.add_argument("--text-layers", type=int, default=None,
                    help="decoder layers of OUT (default: SRC's; at least SRC's)")
    gr.add_argument("--vision-layers", type=int, default=None,
                    help="vision-encoder layers of OUT (default: SRC's; at least SRC's)")
    gr.add_argument("--init", choices=["copy", "fresh"], default="copy",
                    help="a new layer's other tensors: copy = the SRC layer before it (default); fresh = "
                         "projections N(0, initializer_range), norms 1, biases 0, drawn from --seed")
    gr.add_argument("--seed", type=int, default=None, help="the fresh init's draws (--init fresh; default 0)")
    av = sub.add_parser("average", help="two checkpoints of one architecture -> their weighted mean "
                        "(1 - W) * A + W * B, in A's dtypes and layout (the trainer's glyph head too)")
    av.add_argument("a", type=Path, help="checkpoint A (its config, tokenizer and dtypes are OUT's)")
    av.add_argument("b", type=Path, help="checkpoint B: the same config and tensors")
    av.add_argument("out", type=Path, help="new or empty checkpoint directory to write")
    av.add_argument("--weight", type=float, default=0.5, help="B's share, 0..1 (default 0.5)")
    sub.add_parser("train", help="train the demo model (options: python -m quantize train --help)", add_help=False)
    sub.add_parser("docgen", help="generate synthetic business documents (python -m quantize docgen --help)",
                   add_help=False)
    sub.add_parser("htmldocs", help="render HTML/CSS business documents and reading pages in headless Chromium "
                   "(python -m quantize htmldocs --help)", add_help=False)
    sub.add_parser("compare", help="edgeocr check where a side may be hf:CHECKPOINT (transformers) "
                   "(python -m quantize compare --help)", add_help=False)
    sub.add_parser("bench-hf", help="edgeocr bench beside transformers generate on the same job, with ratios "
                   "(python -m quantize bench-hf --help)", add_help=False)
    ap.add_argument("-v", "--verbose", action="store_true")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("compare", "bench-hf"):
        from quantize import compare
        return (compare.compare_main if argv[0] == "compare" else compare.bench_main)(argv[1:])
    if argv and argv[0] in ("train", "docgen", "htmldocs"):          # their own argument parsers
        if argv[0] == "train":
            from quantize.train import main as train_main
            return train_main(argv[1:])
        if argv[0] == "htmldocs":
            from quantize.htmldocs import main as htmldocs_main
            return htmldocs_main(argv[1:])
        from quantize.docgen import main as docgen_main
        return docgen_main(argv[1:])
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    out = getattr(args, "out", None)
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        print(f"error: {out} is a file; OUT is the artifact directory to write", file=sys.stderr)
        return 2
    try:
        if args.cmd == "export":
            from quantize.export import export
            m = export(args.checkpoint, args.out, _export_options(args, args.precision), progress=_progress)
            _print_sizes(m, args.out)
        elif args.cmd == "int8":
            _int8(args)
        elif args.cmd == "weight-int8":
            from quantize.weight_int8 import build_cpu, build_weight_int8
            if args.target == "cpu":
                if args.include_lm_head or args.decoder_only:
                    raise ValueError("--target cpu always includes the lm_head and the vision graph")
                m = build_cpu(args.artifact, args.out, args.bits, args.block_size, progress=_progress)
            else:
                m = build_weight_int8(args.artifact, args.out, args.block_size, lm_head=args.include_lm_head,
                                      vision=not args.decoder_only, progress=_progress, bits=args.bits)
            _print_sizes(m, args.out)
        elif args.cmd == "reslot":
            from quantize.export import reslot
            m = reslot(args.artifact, args.out, args.slots)
            _progress(f"{args.out}: {m.slots} slot(s), KV cache {m.kv.bytes / 2**20:.0f} MiB")
        elif args.cmd == "fuse":
            from quantize.fuse import FuseOptions, fuse_artifact
            _print_sizes(fuse_artifact(args.artifact, args.out, FuseOptions(
                target=args.target, gqa_qk_norm=not args.no_gqa_qk_norm,
                attention_bias=not args.no_attention_bias, vision_gemms=args.vision_gemms),
                progress=_progress), args.out)
        elif args.cmd == "step-state":
            from quantize.step_state import step_state_artifact
            _print_sizes(step_state_artifact(args.artifact, args.out, progress=_progress), args.out)
        elif args.cmd == "native-step":
            from quantize.native_step import native_step_artifact
            _print_sizes(native_step_artifact(args.artifact, args.out, progress=_progress, weights=args.weights,
                                              vision=args.vision, embedding=args.embedding,
                                              vision_gemms=False if args.no_vision_gemms else None,
                                              vision_qkv=args.vision_qkv), args.out)
        elif args.cmd == "grow":
            _grow(args)
        elif args.cmd == "average":
            from quantize.average import average
            r = average(args.a, args.b, args.out, args.weight, progress=_progress)
            print(f"{args.out}: {r.tensors} tensors, {r.parameters:,} parameters, {1 - args.weight:g} x {args.a} + "
                  f"{args.weight:g} x {args.b}{' (glyph head averaged too)' if r.glyph_head else ''}")
        elif args.cmd == "tiny":
            from quantize.tiny import TINY_A, TINY_B, make_tiny_checkpoint
            tc = {"tiny-a": TINY_A, "tiny-b": TINY_B}[args.config]
            make_tiny_checkpoint(args.out, tc, seed=args.seed)
            _progress(f"tiny checkpoint {tc.name} written to {args.out}")
    except (EdgeOCRError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
