"""The end of scripts/demo.sh: what the demo read, how well and how fast, where everything is, what next.

    python scripts/demo_summary.py build/demo-check.json build/demo-fp32 build/demo-int8
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from edgeocr.check import format_pages


def _mib(d: Path) -> str:
    return f"{sum(f.stat().st_size for f in d.rglob('*') if f.is_file()) / 2**20:.1f} MiB"


def main(report_path: str, fp32: str, int8: str) -> None:
    report = json.loads(Path(report_path).read_text(encoding="utf-8"))
    meta = report["meta"]
    print(f"\n== {report['summary']['pages']} held-out pages of {meta['data']}, task {meta['task']}: "
          f"ground truth, then each build's CER and text")
    print(format_pages(report, names=("FP32", "INT8")))
    print("(texts cut to their start; INT8 is the calibrated Q/DQ build made for TensorRT, which ONNX Runtime's CPU "
          "provider runs slower than FP32; the CPU build is an FP32 export with --attention gqa --select-on-device, "
          "`quantize fuse --target portable`, then `quantize weight-int8 FUSED OUT --target cpu`: README, which "
          "artifact on which device)")
    print(f"\nartifacts  {fp32} ({_mib(Path(fp32))}), {int8} ({_mib(Path(int8))})")
    print(f"report     {report_path} and {Path(report_path).with_suffix('.csv')} (every page, every metric)")
    print("next       .venv/bin/edgeocr run calibration_data/eval/000004.jpg --model build/demo-fp32   # one page\n"
          "           .venv/bin/edgeocr run calibration_data/eval --model build/demo-fp32 --out eval.jsonl  # a folder\n"
          "           .venv/bin/edgeocr check --reference build/demo-fp32 --candidate build/demo-int8 "
          "--data calibration_data/eval --show-pages   # all 64 pages\n"
          "           the 7.8M-parameter demo model reads pages of its own generator (whitespace-free CER on all "
          "64 eval pages: FP32 3.2 %, INT8 3.2 %; the 3 pages above are a sample), other documents less well "
          "(18 % on HTML pages; demo_model/README.md); for real OCR, export the real checkpoint (README)")


if __name__ == "__main__":
    main(*sys.argv[1:4])
