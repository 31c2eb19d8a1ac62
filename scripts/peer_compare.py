#!/usr/bin/env python3
"""Score other OCR engines and edgeocr artifacts on the same labelled pages with the same metric.

    python scripts/peer_compare.py --data calibration_data/eval \
        [--systems rapidocr,tesseract,fp16,fp32,int8] [--fp16|--fp32|--int8 ARTIFACT_DIR] [--limit N] \
        [--out-md peer_compare.md] [--out-json peer_compare.json] [--resume]

Systems:
- rapidocr: RapidOCR (`rapidocr_onnxruntime`, PP-OCRv4 ONNX models it ships, default settings; the
  `peer` extra).  It returns one box per text segment; the full text puts them in reading order:
  boxes whose vertical centres (corrected for the page's skew: the median slope of the boxes' top
  edges) lie within half a box height of a line's centre form one line, lines run top to bottom, the
  boxes of a line left to right joined by a space, lines by newlines.
- tesseract: Tesseract 5 (`tesseract IMAGE stdout -l chi_sim+eng --psm 6`; Debian tesseract-ocr,
  tesseract-ocr-chi-sim, tesseract-ocr-eng), its text as printed.
- fp16, fp32, int8: edgeocr artifacts (paths from --fp16 / --fp32 / --int8) on ONNX Runtime CPU, task structured_parse
  (full text in reading order), greedy decoding with the artifact's own repetition penalty.
By default: rapidocr, tesseract when on PATH, and each artifact given.

Metric, per page, against the label's full text (edgeocr.dataset.Sample.text, as `edgeocr check` uses
it: "text", else the lines joined by newlines): whitespace-free CER (edits / label length, all
whitespace removed from both strings) and the same after NFKC normalization; plain CER for reference.
The table gives mean and median over pages and seconds per page.  Systems run page by page, one page
after another, and both output files are rewritten after every page, so an interrupted run leaves a
valid report of the pages done; --resume keeps the results of an earlier run of the same system (same
engine version and settings, same artifact manifest) and runs only what is missing.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgeocr import metrics
from edgeocr.dataset import load_dir

METRICS = ("cer_nows", "cer_nows_nfkc", "cer")
TESSERACT_ARGS = ["-l", "chi_sim+eng", "--psm", "6"]


def rapidocr_lines(result) -> str:
    """RapidOCR's [(box 4x2, text, score), ...] as text in reading order (see the module docstring).

    Boxes are quadrilaterals (top-left, top-right, bottom-right, bottom-left) that follow the text's slant;
    on a skewed page a row rises or falls across the width, so vertical centres are first corrected by the
    median slope of the boxes' top edges (y - slope * x) before rows are formed."""
    result = list(result or [])
    slopes = [(b[1][1] - b[0][1]) / (b[1][0] - b[0][0]) for b, _t, _s in result if b[1][0] - b[0][0] > 1]
    slope = statistics.median(slopes) if slopes else 0.0
    items = []
    for box, text, _score in result:
        ys = [p[1] for p in box]
        xs = [p[0] for p in box]
        xc, yc = (min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2
        height = max((box[3][1] - box[0][1] + box[2][1] - box[1][1]) / 2, 1.0)
        items.append((yc - slope * xc, height, min(xs), text))
    items.sort(key=lambda t: (t[0], t[2]))
    lines: list[list] = []
    for it in items:
        if lines:
            line = lines[-1]
            centre = statistics.fmean(i[0] for i in line)
            height = statistics.fmean(i[1] for i in line)
            if abs(it[0] - centre) <= 0.5 * min(height, it[1]):
                line.append(it)
                continue
        lines.append([it])
    return "\n".join(" ".join(i[3] for i in sorted(line, key=lambda i: i[2])) for line in lines)


class RapidOCRSystem:
    name = "rapidocr"

    def __init__(self):
        from importlib.metadata import version

        from rapidocr_onnxruntime import RapidOCR
        self.engine = RapidOCR()
        self.meta = {"engine": "RapidOCR", "package": f"rapidocr_onnxruntime {version('rapidocr_onnxruntime')}",
                     "settings": "default (PP-OCRv4 det/cls/rec ONNX shipped with the package)",
                     "reading_order": "lines by vertical centre, top to bottom; boxes left to right"}

    def read(self, path: Path) -> dict:
        result, _elapse = self.engine(str(path))
        return {"text": rapidocr_lines(result)}


class TesseractSystem:
    name = "tesseract"

    def __init__(self, exe: str):
        self.exe = exe
        ver = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
        first = (ver.stdout or ver.stderr).splitlines()[0].strip()
        self.meta = {"engine": "Tesseract", "package": first, "settings": " ".join(TESSERACT_ARGS)}

    def read(self, path: Path) -> dict:
        r = subprocess.run([self.exe, str(path), "stdout", *TESSERACT_ARGS], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"tesseract failed on {path}: {r.stderr.strip()[-300:]}")
        return {"text": r.stdout.strip()}


class EdgeOCRSystem:
    def __init__(self, name: str, artifact: str, max_new_tokens: int, threads: int | None):
        from edgeocr.decode import DecodeOptions
        from edgeocr.model import OCRModel
        self.name = name
        self.model = OCRModel(artifact, threads=threads)
        self.opts = DecodeOptions(max_new_tokens=max_new_tokens)
        manifest = Path(artifact) / "manifest.json"
        self.meta = {"engine": "edgeocr", "artifact": str(artifact), "precision": self.model.artifact.precision,
                     "manifest_sha256": hashlib.sha256(manifest.read_bytes()).hexdigest()[:16],
                     "settings": f"task structured_parse, max_new_tokens {max_new_tokens}, ONNX Runtime CPU"}

    def read(self, path: Path) -> dict:
        r = self.model.recognize(path, task="structured_parse", options=self.opts)
        return {"text": r.text, "tokens": len(r.token_ids), "finish_reason": r.finish_reason}


def score(hyp: str, ref: str) -> dict:
    return {"cer_nows": metrics.cer_nows(hyp, ref), "cer_nows_nfkc": metrics.cer_nows_nfkc(hyp, ref),
            "cer": metrics.cer(hyp, ref)}


def summarize(pages: list[dict], system: str) -> dict:
    rows = [p["systems"][system] for p in pages if system in p["systems"]]
    s = {"pages": len(rows)}
    for m in METRICS:
        vals = [r[m] for r in rows]
        s[m] = {"mean": statistics.fmean(vals) if vals else None, "median": statistics.median(vals) if vals else None}
    s["seconds_per_page"] = statistics.fmean(r["seconds"] for r in rows) if rows else None
    return s


def _pct(v) -> str:
    return "-" if v is None else f"{v * 100:.1f} %"


def markdown(report: dict) -> str:
    m = report["meta"]
    out = [f"Pages: {m['data']} ({m['pages_done']} of {m['pages']} page(s) done); {m['machine']}; {m['date']}.", "",
           "| system | pages | CER, no whitespace: mean | median | NFKC, no whitespace: mean | median "
           "| plain CER: mean | s / page |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    labels = {}
    for name, s in report["summary"].items():
        sysm = report["systems"][name]
        label = labels[name] = {"rapidocr": "RapidOCR", "tesseract": "Tesseract"}.get(name, f"edgeocr {name}")
        detail = sysm.get("package") or f"{Path(sysm['artifact']).name}, {sysm['precision']}"
        sec = "-" if s["seconds_per_page"] is None else f"{s['seconds_per_page']:.2f}"
        out.append(f"| {label} ({detail}) | {s['pages']} | {_pct(s['cer_nows']['mean'])} | "
                   f"{_pct(s['cer_nows']['median'])} | {_pct(s['cer_nows_nfkc']['mean'])} | "
                   f"{_pct(s['cer_nows_nfkc']['median'])} | {_pct(s['cer']['mean'])} | {sec} |")
    kinds = sorted({p["kind"] for p in report["pages"] if p.get("kind")})
    if kinds:
        out += ["", "Whitespace-free CER by document kind (mean over the kind's pages):", "",
                "| kind | pages | " + " | ".join(labels.values()) + " |", "|---|---:|" + "---:|" * len(labels)]
        for k in kinds:
            ps = [p for p in report["pages"] if p.get("kind") == k]
            cells = []
            for name in labels:
                vals = [p["systems"][name]["cer_nows"] for p in ps if name in p["systems"]]
                cells.append(_pct(statistics.fmean(vals)) if vals else "-")
            out.append(f"| {k} | {len(ps)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _atomic_write(path: Path, data: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


ARTIFACTS = ("fp16", "fp32", "int8")   # edgeocr systems, each read from the artifact its flag names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="calibration_data/eval", help="page images with labels.jsonl")
    ap.add_argument("--systems", default=None,
                    help="comma-separated subset of rapidocr,tesseract,fp16,fp32,int8 (default: rapidocr, tesseract "
                         "when installed, and the artifacts given)")
    ap.add_argument("--fp16", default=None, help="edgeocr FP16 artifact directory")
    ap.add_argument("--fp32", default=None, help="edgeocr FP32 artifact directory")
    ap.add_argument("--int8", default=None, help="edgeocr INT8 artifact directory")
    ap.add_argument("--limit", type=int, default=None, help="only the first N pages (sorted by file name)")
    ap.add_argument("--max-new-tokens", type=int, default=1024, help="edgeocr decoding cap (default %(default)s)")
    ap.add_argument("--threads", type=int, default=None, help="edgeocr ONNX Runtime threads")
    ap.add_argument("--out-md", default="peer_compare.md")
    ap.add_argument("--out-json", default="peer_compare.json")
    ap.add_argument("--resume", action="store_true", help="keep matching results from an existing --out-json")
    ap.add_argument("--machine", default=None, help="machine description for the report (default: from the host)")
    ap.add_argument("--date", default=None, help="date for the report (default: today)")
    args = ap.parse_args(argv)

    tess = shutil.which("tesseract")
    if args.systems:
        names = [s.strip() for s in args.systems.split(",") if s.strip()]
    else:
        names = ["rapidocr"] + (["tesseract"] if tess else []) + [n for n in ARTIFACTS if getattr(args, n)]
    bad = [n for n in names if n not in ("rapidocr", "tesseract", *ARTIFACTS)]
    if bad or not names:
        ap.error(f"unknown system(s) {bad}; choose from rapidocr, tesseract, {', '.join(ARTIFACTS)}")
    for n in ARTIFACTS:
        if n in names and not getattr(args, n):
            ap.error(f"system {n} needs --{n} ARTIFACT_DIR")
    if "tesseract" in names and not tess:
        ap.error("tesseract is not on PATH (Debian: apt-get install tesseract-ocr tesseract-ocr-chi-sim)")

    samples = load_dir(args.data)
    samples = [s for s in samples if s.text is not None][:args.limit]
    if not samples:
        ap.error(f"{args.data}: no labelled pages")

    systems = {}
    for n in names:
        if n == "rapidocr":
            systems[n] = RapidOCRSystem()
        elif n == "tesseract":
            systems[n] = TesseractSystem(tess)
        else:
            systems[n] = EdgeOCRSystem(n, getattr(args, n), args.max_new_tokens, args.threads)

    out_json, out_md = Path(args.out_json), Path(args.out_md)
    previous: dict[str, dict] = {}
    if args.resume and out_json.exists():
        old = json.loads(out_json.read_text(encoding="utf-8"))
        same = {n for n, m in old.get("systems", {}).items() if n in systems and m == systems[n].meta}
        for p in old.get("pages", []):
            previous[p["image"]] = {n: r for n, r in p["systems"].items() if n in same}

    meta = {"data": str(args.data), "pages": len(samples), "task": "structured_parse",
            "metric": "CER with all whitespace removed from hypothesis and label (edgeocr.metrics.cer_nows); "
                      "cer_nows_nfkc after NFKC normalization; cer without either",
            "machine": args.machine or f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "date": args.date or datetime.date.today().isoformat()}
    pages: list[dict] = []

    def write():
        report = {"meta": dict(meta, pages_done=len(pages)), "systems": {n: s.meta for n, s in systems.items()},
                  "summary": {n: summarize(pages, n) for n in systems}, "pages": pages}
        _atomic_write(out_json, json.dumps(report, ensure_ascii=False, indent=1))
        _atomic_write(out_md, markdown(report))
        return report

    for i, s in enumerate(samples, 1):
        ref = s.text
        page = {"image": s.name, "kind": (s.label or {}).get("kind"), "systems": {}}
        for n, system in systems.items():
            done = previous.get(s.name, {}).get(n)
            if done is not None:
                page["systems"][n] = done
                continue
            t0 = time.perf_counter()
            r = system.read(s.path)
            r["seconds"] = round(time.perf_counter() - t0, 3)
            r.update(score(r["text"], ref))
            page["systems"][n] = r
            print(f"[{i}/{len(samples)}] {s.name} {n}: CER no-ws {r['cer_nows'] * 100:.1f} % "
                  f"({r['seconds']:.1f} s)", file=sys.stderr, flush=True)
        pages.append(page)
        write()
    report = write()
    print(markdown(report), end="")
    print(f"wrote {out_md} and {out_json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
