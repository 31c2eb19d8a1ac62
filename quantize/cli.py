"""`python -m quantize`: the offline toolchain (needs the [export] extra: torch, transformers, onnx).

    python -m quantize export CHECKPOINT OUT [--precision fp32|fp16] [--max-cache-len N] [--rope-layout A|B]
                                            [--attention masked|gqa]
    python -m quantize weight-int8 ARTIFACT OUT [--block-size 32] [--include-lm-head] [--decoder-only]
    python -m quantize fuse ARTIFACT OUT [--target cuda|portable]
    python -m quantize tiny OUT [--config tiny-a|tiny-b] [--seed N]
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


def _build(args) -> None:
    import shutil
    import tempfile

    from quantize.export import ExportOptions, export

    t0 = time.perf_counter()
    common = dict(max_cache_len=args.max_cache_len, max_prefill_len=args.max_prefill_len,
                  rope_layout=args.rope_layout, device=args.device, attention=args.attention,
                  select_on_device=args.select_on_device)
    if args.precision in ("fp16", "fp32"):
        m = export(args.checkpoint, args.out, ExportOptions(precision=args.precision, **common), progress=_progress)
    else:
        from quantize.int8 import Int8Options, build_int8
        args.out.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=args.out.parent, prefix=".fp32-"))
        try:
            export(args.checkpoint, work, ExportOptions(precision="fp32", **common), progress=_progress)
            m = build_int8(work, args.calib, args.out, Int8Options(
                calib_images=args.calib_images, holdout_images=args.holdout_images,
                max_reverted=0 if args.no_sensitivity else Int8Options.max_reverted), progress=_progress)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    _print_sizes(m, args.out)
    _progress(f"{args.precision} artifact built in {time.perf_counter() - t0:.0f} s")


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
    e = sub.add_parser("export", help="checkpoint -> ONNX artifact directory")
    e.add_argument("checkpoint", type=Path, help="Hugging Face HunyuanOCR checkpoint directory")
    e.add_argument("out", type=Path, help="artifact directory to write")
    e.add_argument("--precision", choices=["fp32", "fp16"], default="fp32")
    e.add_argument("--max-cache-len", type=int, default=4096, help="static KV cache length, tokens (default 4096)")
    e.add_argument("--max-prefill-len", type=int, default=2048, help="longest prompt, tokens (default 2048)")
    e.add_argument("--rope-layout", choices=["A", "B"], default="B",
                   help="XD-RoPE layout: B = transformers >= 5.13 (default), A = vLLM / Tencent training code")
    e.add_argument("--device", default="cpu", help="torch device used for tracing (cuda speeds up big models)")
    _graph_flavour_args(e)
    b = sub.add_parser("build", help="checkpoint -> FP16 artifact, or checkpoint + calibration images -> INT8 artifact")
    b.add_argument("checkpoint", type=Path)
    b.add_argument("out", type=Path)
    b.add_argument("--precision", choices=["fp16", "int8", "fp32"], default="fp16")
    b.add_argument("--calib", type=Path, default=Path("calibration_data/calib"), help="calibration images (INT8)")
    b.add_argument("--calib-images", type=int, default=32)
    b.add_argument("--holdout-images", type=int, default=8)
    b.add_argument("--no-sensitivity", action="store_true",
                   help="measure the held-out gate but do not revert layers when it fails")
    b.add_argument("--max-cache-len", type=int, default=4096)
    b.add_argument("--max-prefill-len", type=int, default=2048)
    b.add_argument("--rope-layout", choices=["A", "B"], default="B")
    b.add_argument("--device", default="cpu", help="torch device used for tracing")
    _graph_flavour_args(b)
    w = sub.add_parser("weight-int8", help="FP16/FP32 artifact -> decoder MatMul weights as 8-bit blocks "
                       "(ONNX Runtime MatMulNBits: fewer bytes read per decoded token; no calibration)")
    w.add_argument("artifact", type=Path)
    w.add_argument("out", type=Path)
    w.add_argument("--block-size", type=int, default=32, help="inputs sharing one scale (power of two >= 16)")
    w.add_argument("--include-lm-head", action="store_true",
                   help="also the (tied) lm_head, as a second INT8 copy of the embedding (slower on ORT 1.31 CUDA)")
    w.add_argument("--decoder-only", action="store_true",
                   help="keep the vision graph's weights as they are (by default they are stored in 8 bits too)")
    f = sub.add_parser("fuse", help="artifact -> the same artifact with fused ONNX Runtime graphs (fewer kernels "
                       "per decode step and per vision call; run before weight-int8)")
    f.add_argument("artifact", type=Path)
    f.add_argument("out", type=Path, help="fused artifact directory (may equal ARTIFACT)")
    f.add_argument("--target", choices=["cuda", "portable"], default="cuda",
                   help="cuda (default): also ops only ONNX Runtime's CUDA EP runs; portable: every EP, CPU included")
    f.add_argument("--no-swiglu", action="store_true", help="cuda target: keep the MLP gate as exported")
    f.add_argument("--no-gqa-qk-norm", action="store_true",
                   help="cuda target: keep q|k|v split and the Q/K norms outside GroupQueryAttention")
    t = sub.add_parser("tiny", help="make a tiny random-weight HunyuanVL checkpoint (tests, demos)")
    t.add_argument("out", type=Path)
    t.add_argument("--config", choices=["tiny-a", "tiny-b"], default="tiny-a")
    t.add_argument("--seed", type=int, default=0)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.cmd == "export":
            from quantize.export import ExportOptions, export
            m = export(args.checkpoint, args.out, ExportOptions(
                max_cache_len=args.max_cache_len, max_prefill_len=args.max_prefill_len,
                rope_layout=args.rope_layout, precision=args.precision, device=args.device,
                attention=args.attention, select_on_device=args.select_on_device), progress=_progress)
            _print_sizes(m, args.out)
        elif args.cmd == "build":
            _build(args)
        elif args.cmd == "weight-int8":
            from quantize.weight_int8 import build_weight_int8
            _print_sizes(build_weight_int8(args.artifact, args.out, args.block_size, lm_head=args.include_lm_head,
                                           vision=not args.decoder_only, progress=_progress), args.out)
        elif args.cmd == "fuse":
            from quantize.fuse import FuseOptions, fuse_artifact
            _print_sizes(fuse_artifact(args.artifact, args.out, FuseOptions(
                target=args.target, swiglu=not args.no_swiglu, gqa_qk_norm=not args.no_gqa_qk_norm),
                progress=_progress), args.out)
        elif args.cmd == "tiny":
            from quantize.tiny import TINY_A, TINY_B, make_tiny_checkpoint
            tc = {"tiny-a": TINY_A, "tiny-b": TINY_B}[args.config]
            make_tiny_checkpoint(args.out, tc, seed=args.seed)
            _progress(f"tiny checkpoint {tc.name} written to {args.out}")
    except (EdgeOCRError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
