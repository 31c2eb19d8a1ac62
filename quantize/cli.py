"""`python -m quantize`: the offline toolchain (needs the [export] extra: torch, transformers, onnx).

    python -m quantize export CHECKPOINT OUT [--precision fp32|fp16] [--max-cache-len N] [--rope-layout A|B]
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
                rope_layout=args.rope_layout, precision=args.precision, device=args.device), progress=_progress)
            for name, info in sorted(m.files.items()):
                print(f"{info['bytes'] / 2**20:10.2f} MiB  {name}")
            print(f"{sum(i['bytes'] for i in m.files.values()) / 2**20:10.2f} MiB  total -> {args.out}")
        elif args.cmd == "tiny":
            from quantize.tiny import TINY_A, TINY_B, make_tiny_checkpoint
            tc = {"tiny-a": TINY_A, "tiny-b": TINY_B}[args.config]
            make_tiny_checkpoint(args.out, tc, seed=args.seed)
            _progress(f"tiny checkpoint {tc.name} written to {args.out}")
    except EdgeOCRError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
