"""`edgeocr check`: compare two artifacts (e.g. FP16 and INT8) or backends page by page.

    edgeocr check --reference FP16_DIR --candidate INT8_DIR --data calibration_data/eval \
        [--task structured_parse|spotting|fields|...] [--max-cer-increase 0.01] [--out report]

Per page: both outputs, CER/NED against ground truth when labels exist (CER also whitespace-free and
NFKC-normalized whitespace-free: `cer_nows`, `cer_nows_nfkc` in edgeocr.metrics), field accuracy for
extraction, exact agreement, the first divergent token, repetition and truncation flags, per-stage
latency.  A page that cannot be read (corrupt, too small, over the pixel limit) is an error row; the run
goes on and the summary counts it.  Writes OUT.json and OUT.csv atomically; OUT.pages.jsonl records
finished pages so an interrupted run resumes without redoing them (error rows are tried again).
Exit codes: 0 gates hold, 3 a gate failed, 1 a page could not be read (or an error), 2 usage.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeocr import metrics, preprocess, prompts
from edgeocr.dataset import Sample, load_dir
from edgeocr.decode import DecodeOptions, FinishReason
from edgeocr.errors import EdgeOCRError, ImageError

log = logging.getLogger("edgeocr.check")

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_GATE = 0, 1, 2, 3
FIELDS_TASK = "fields"
TRUNCATED = (FinishReason.LENGTH, FinishReason.CACHE_FULL)


class Runner:
    """One side of the comparison: an artifact on a backend/device.  Another implementation (the transformers
    reference of `python -m quantize compare`) is a runner with the same `label`, `identity` and `run`, made by
    the `open_runner` handed to `run_check`."""

    def __init__(self, spec: str, device: str = "cpu", threads: int | None = None):
        if spec.startswith("hf:"):
            raise EdgeOCRError(f"{spec!r} names a transformers checkpoint, which the runtime does not run: "
                               "compare against it with `python -m quantize compare` (same arguments)")
        from edgeocr.model import OCRModel
        self.spec = spec
        self.impl = OCRModel(spec, device=device, threads=threads)
        self.label = f"{Path(spec).name} ({self.impl.artifact.precision}, {self.impl.session.name})"
        self.identity = hash_dir_files(Path(spec), ("manifest.json",)) + ":" + device

    def run(self, image, task, prompt, lang, opts):
        return self.impl.recognize(image, task=task, prompt=prompt, lang=lang, options=opts)


def hash_dir_files(d: Path, names) -> str:
    h = hashlib.sha256()
    for n in names:
        p = d / n
        h.update(p.read_bytes() if p.exists() else b"")
    return h.hexdigest()[:16]


def _hyp_text(result, task: str) -> str:
    if task in prompts.SPOTTING_TASKS:
        return "\n".join(ln.text for ln in result.lines)
    return result.text


def _side(result, task, ref, fields, gold_boxes=None) -> dict:
    hyp = _hyp_text(result, task)
    d = {"text": result.text, "tokens": len(result.token_ids), "finish_reason": result.finish_reason,
         "repetition": result.finish_reason == FinishReason.REPETITION,
         "truncated": result.finish_reason in TRUNCATED,
         "timings_ms": {k: round(v, 2) for k, v in result.timings_ms.items()}}
    if ref is not None:
        d["cer"] = metrics.cer(hyp, ref)
        d["cer_nows"] = metrics.cer_nows(hyp, ref)
        d["cer_nows_nfkc"] = metrics.cer_nows_nfkc(hyp, ref)
        d["ned"] = metrics.ned(hyp, ref)
    if fields:
        d["field_accuracy"] = metrics.field_accuracy(result.text, fields)
    if gold_boxes:
        sc = metrics.spotting_scores([list(ln.box) for ln in result.lines], gold_boxes)
        d["box_iou"], d["box_f1"] = sc["mean_iou"], sc["f1"]
    return d


def compare_page(ref_runner: Runner, cand_runner: Runner, sample: Sample, task: str, lang: str,
                 opts: DecodeOptions, max_pixels: int | None = None) -> dict:
    """Both sides on one page; {"image", "error": {type, message}} when the page cannot be read."""
    try:
        image = np.asarray(preprocess.load_image(sample.path, max_pixels))   # [H, W, 3] uint8, read once
    except ImageError as e:
        return {"image": sample.name, "error": {"type": type(e).__name__, "message": str(e)}}
    fields = (sample.fields or {}) if task == FIELDS_TASK else None
    if task == FIELDS_TASK:
        if not fields:
            raise EdgeOCRError(f"{sample.name}: task 'fields' needs labelled fields")
        t, p = None, prompts.field_extraction_prompt(list(fields), "en")
    else:
        t, p = task, None
    ref_text = sample.text if task != FIELDS_TASK else None
    gold = None
    if task in prompts.SPOTTING_TASKS and sample.label and sample.label.get("lines"):
        gold = [ln["box"] for ln in sample.label["lines"] if "box" in ln]
    ra = ref_runner.run(image, t, p, lang, opts)
    rb = cand_runner.run(image, t, p, lang, opts)
    div = metrics.first_divergence(ra.token_ids, rb.token_ids)
    return {"image": sample.name, "truth": ref_text, "reference": _side(ra, task, ref_text, fields, gold),
            "candidate": _side(rb, task, ref_text, fields, gold), "exact_match": ra.token_ids == rb.token_ids,
            "first_divergent_token": div, "pair_ned": metrics.ned(rb.text, ra.text)}


def summarize(pages: list[dict]) -> dict:
    """Means over the pages read; `errors` counts the pages that could not be read."""
    errors = sum("error" in p for p in pages)
    pages = [p for p in pages if "error" not in p]

    def mean(key, side):
        vals = [p[side][key] for p in pages if key in p[side]]
        if key.startswith("cer_") and len(vals) != sum("cer" in p[side] for p in pages):
            return None      # pages resumed from a report written before this metric existed
        return statistics.fmean(vals) if vals else None

    s = {"pages": len(pages), "errors": errors,
         "exact_agreement": statistics.fmean(p["exact_match"] for p in pages) if pages else None,
         "mean_pair_ned": statistics.fmean(p["pair_ned"] for p in pages) if pages else None}
    for side in ("reference", "candidate"):
        s[side] = {"cer": mean("cer", side), "cer_nows": mean("cer_nows", side),
                   "cer_nows_nfkc": mean("cer_nows_nfkc", side), "ned": mean("ned", side),
                   "field_accuracy": mean("field_accuracy", side),
                   "box_iou": mean("box_iou", side), "box_f1": mean("box_f1", side),
                   "repetition_rate": statistics.fmean(p[side]["repetition"] for p in pages) if pages else None,
                   "truncation_rate": statistics.fmean(p[side]["truncated"] for p in pages) if pages else None,
                   "mean_total_ms": statistics.fmean(p[side]["timings_ms"]["total"] for p in pages) if pages else None}
    if s["reference"]["cer"] is not None and s["candidate"]["cer"] is not None:
        s["cer_increase"] = s["candidate"]["cer"] - s["reference"]["cer"]
    return s


def _atomic_write(path: Path, data: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_reports(out: Path, meta: dict, pages: list[dict], summary: dict) -> None:
    _atomic_write(out.with_suffix(".json"), json.dumps({"meta": meta, "summary": summary, "pages": pages},
                                                        ensure_ascii=False, indent=2))
    buf = io.StringIO()
    cols = ["image", "exact_match", "first_divergent_token", "pair_ned"]
    sides = ["cer", "cer_nows", "cer_nows_nfkc", "ned", "field_accuracy", "box_iou", "box_f1", "tokens",
             "finish_reason", "repetition", "truncated"]
    w = csv.writer(buf)
    w.writerow(cols + [f"{s}_{k}" for s in ("reference", "candidate") for k in sides]
               + ["reference_total_ms", "candidate_total_ms", "error"])
    for p in pages:
        if "error" in p:
            w.writerow([p["image"]] + [""] * (len(cols) - 1 + 2 * len(sides) + 2) + [p["error"]["message"]])
            continue
        w.writerow([p[c] for c in cols] + [p[s].get(k, "") for s in ("reference", "candidate") for k in sides]
                   + [p["reference"]["timings_ms"]["total"], p["candidate"]["timings_ms"]["total"]])
    _atomic_write(out.with_suffix(".csv"), buf.getvalue())


def format_summary(s: dict, ref_label: str, cand_label: str) -> str:
    def f(v, pct=False):
        if v is None:
            return "-"
        return f"{v * 100:.2f}%" if pct else f"{v:.1f}"

    rows = [("", "reference", "candidate"), ("", ref_label[:34], cand_label[:34]),
            ("CER", f(s["reference"]["cer"], True), f(s["candidate"]["cer"], True)),
            ("CER, no whitespace", f(s["reference"].get("cer_nows"), True), f(s["candidate"].get("cer_nows"), True)),
            ("CER, NFKC, no ws", f(s["reference"].get("cer_nows_nfkc"), True),
             f(s["candidate"].get("cer_nows_nfkc"), True)),
            ("NED", f(s["reference"]["ned"], True), f(s["candidate"]["ned"], True)),
            ("field accuracy", f(s["reference"]["field_accuracy"], True), f(s["candidate"]["field_accuracy"], True)),
            ("box IoU (spotting)", f(s["reference"].get("box_iou"), True), f(s["candidate"].get("box_iou"), True)),
            ("box F1@0.5", f(s["reference"].get("box_f1"), True), f(s["candidate"].get("box_f1"), True)),
            ("repetition", f(s["reference"]["repetition_rate"], True), f(s["candidate"]["repetition_rate"], True)),
            ("truncated", f(s["reference"]["truncation_rate"], True), f(s["candidate"]["truncation_rate"], True)),
            ("mean latency (ms)", f(s["reference"]["mean_total_ms"]), f(s["candidate"]["mean_total_ms"]))]
    out = [f"{a:20s} {b:>36s} {c:>36s}" for a, b, c in rows]
    unread = f" ({s['errors']} more could not be read)" if s.get("errors") else ""
    out.append(f"{'pages':20s} {s['pages']}{unread}; exact agreement {f(s['exact_agreement'], True)}; "
               f"mean NED between outputs {f(s['mean_pair_ned'], True)}")
    if s.get("cer_increase") is not None:
        out.append(f"{'CER change':20s} {s['cer_increase'] * 100:+.2f} points")
    return "\n".join(out)


def _one_line(text: str | None, width: int) -> str:
    """A text on one line of at most `width` characters: newlines as ⏎, the cut marked with …."""
    if text is None:
        return "(no ground truth)"
    flat = " ".join(text.replace("\n", " ⏎ ").split())
    return flat if len(flat) <= width else flat[:width - 1] + "…"


def format_pages(report: dict, names: tuple[str, str] = ("reference", "candidate"), width: int = 80) -> str:
    """Per page: the ground truth beside each side's text (first `width` characters) and its CER; then each
    side's mean CER and speed.  `report`: the OUT.json of a check."""
    sides = ("reference", "candidate")
    tag = max(len(n) for n in (*names, "truth"))
    out = []
    cer_w = len("CER 100.0%  no-ws 100.0%")
    for p in report["pages"]:
        out.append(p["image"])
        if "error" in p:
            out.append(f"  {'error':{tag}s}  {p['error']['message']}")
            continue
        out.append(f"  {'truth':{tag}s}  {'':{cer_w}s}  {_one_line(p.get('truth'), width)}")
        for side, name in zip(sides, names):
            d = p[side]
            cer = f"CER {d['cer'] * 100:5.1f}%  no-ws {d['cer_nows'] * 100:5.1f}%" if "cer" in d else ""
            out.append(f"  {name:{tag}s}  {cer:{cer_w}s}  {_one_line(d['text'], width)}")
    sm = report["summary"]
    for side, name in zip(sides, names):
        v = sm[side]
        cer = (f"mean CER {v['cer'] * 100:.1f}% (no whitespace {v['cer_nows'] * 100:.1f}%)"
               if v.get("cer") is not None else "no ground truth")
        per_token = [p[side]["timings_ms"].get("per_token", 0.0) for p in report["pages"] if "error" not in p]
        speed = (f"{statistics.fmean(per_token):.2f} ms/token, {v['mean_total_ms']:,.0f} ms/page"
                 if per_token else "")
        out.append(f"{name:{tag + 2}s}  {cer}; {speed}")
    if sm.get("errors"):
        out.append(f"{sm['errors']} page(s) could not be read")
    return "\n".join(out)


@dataclass(frozen=True)
class Gates:
    max_cer_increase: float | None = None      # absolute, e.g. 0.01 = one point
    min_agreement: float | None = None         # share of pages with identical tokens


def judge_gates(s: dict, g: Gates) -> tuple[list[str], list[str]]:
    """Each gate given, judged once on the summary: (what failed, what held), each as the figure it measured."""
    failed, held = [], []
    if g.max_cer_increase is not None:
        inc = s.get("cer_increase")
        if inc is None:
            failed.append("--max-cer-increase needs labelled data (no CER computed)")
        elif inc > g.max_cer_increase:
            failed.append(f"CER increase {inc * 100:.2f} points > {g.max_cer_increase * 100:.2f}")
        else:
            held.append(f"CER increase {inc * 100:.2f} points <= {g.max_cer_increase * 100:.2f}")
    if g.min_agreement is not None:
        agree = s["exact_agreement"] or 0.0
        if agree < g.min_agreement:
            failed.append(f"exact agreement {agree * 100:.1f}% < {g.min_agreement * 100:.1f}%")
        else:
            held.append(f"exact agreement {agree * 100:.1f}% >= {g.min_agreement * 100:.1f}%")
    return failed, held


def check_gates(s: dict, g: Gates) -> list[str]:
    """The gates that failed (judge_gates)."""
    return judge_gates(s, g)[0]


def _file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None              # compare_page reports the unreadable file as the page's error


def run_check(reference: str, candidate: str, data: str, out: Path, task: str = prompts.DEFAULT_TASK,
              lang: str = "zh", max_new_tokens: int = 512, gates: Gates = Gates(), resume: bool = True,
              reference_device: str = "cpu", candidate_device: str = "cpu", limit: int | None = None,
              threads: int | None = None, progress=None, max_pixels: int | None = None,
              open_runner=Runner) -> tuple[int, dict]:
    """open_runner(spec, device, threads) -> a runner for each side (default: artifacts only)."""
    if task != FIELDS_TASK and task not in prompts.TASKS_ZH:
        raise EdgeOCRError(f"unknown task {task!r}")
    samples = load_dir(data)[:limit] if limit else load_dir(data)
    ref, cand = open_runner(reference, reference_device, threads), open_runner(candidate, candidate_device, threads)
    opts = DecodeOptions(max_new_tokens=max_new_tokens)
    meta = {"reference": ref.label, "candidate": cand.label, "data": str(data), "task": task, "lang": lang,
            "max_new_tokens": max_new_tokens, "key": f"{ref.identity}|{cand.identity}|{task}|{lang}|{max_new_tokens}"}
    progress_file = out.with_suffix(".pages.jsonl")
    done: dict[tuple[str, str], dict] = {}     # (file name, sha256 of its bytes) -> page
    other = 0                                   # rows of other settings (kept in the file, not resumed)
    if resume and progress_file.exists():
        for line in progress_file.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue         # a line cut by an interruption
            if rec.get("key") != meta["key"]:
                other += 1
            elif rec.get("image_sha256") and "error" not in rec["page"]:
                done[rec["page"]["image"], rec["image_sha256"]] = rec["page"]      # error rows are tried again
    elif progress_file.exists():
        progress_file.unlink()
    pages, resumed = [], 0
    progress_file.parent.mkdir(parents=True, exist_ok=True)
    with open(progress_file, "a", encoding="utf-8") as pf:
        for i, s in enumerate(samples, 1):
            digest = _file_sha256(s.path)          # a page is taken only from the same file content
            if (s.name, digest) in done:
                pages.append(done[s.name, digest])
                resumed += 1
                continue
            t0 = time.perf_counter()
            page = compare_page(ref, cand, s, task, lang, opts, max_pixels)
            pages.append(page)
            pf.write(json.dumps({"key": meta["key"], "image_sha256": digest, "page": page}, ensure_ascii=False) + "\n")
            pf.flush()
            os.fsync(pf.fileno())
            if progress:
                progress(i, len(samples), s.name, page, time.perf_counter() - t0)
    summary = summarize(pages)
    summary["resumed_pages"] = resumed
    summary["other_settings_rows"] = other
    failed, held = judge_gates(summary, gates)
    summary["gates_failed"] = failed
    summary["gates_passed"] = [] if failed else held
    write_reports(out, meta, pages, summary)
    code = EXIT_GATE if failed else EXIT_ERROR if summary["errors"] else EXIT_OK
    return code, dict(summary, meta=meta)


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in 0..1 (one point of CER is 0.01)")
    return v


def add_arguments(ap) -> None:
    from edgeocr.cli import positive_int

    ap.add_argument("--reference", required=True,
                    help="artifact directory (python -m quantize compare also takes hf:CHECKPOINT for transformers)")
    ap.add_argument("--candidate", required=True, help="artifact directory (or hf:CHECKPOINT, as --reference)")
    ap.add_argument("--data", required=True, help="image directory with optional labels.jsonl / labels.csv")
    ap.add_argument("--task", default=prompts.DEFAULT_TASK, choices=[*prompts.task_names(), FIELDS_TASK],
                    metavar="TASK", help=f"official task (edgeocr tasks lists them), or '{FIELDS_TASK}' to ask for "
                                         "the labelled fields as JSON (default %(default)s)")
    ap.add_argument("--lang", choices=["zh", "en"], default="zh", help="prompt language (default %(default)s)")
    ap.add_argument("--max-new-tokens", type=positive_int, default=512, help="tokens per page and side (default %(default)s)")
    ap.add_argument("--out", default="check-report", help="report path without suffix (writes .json, .csv, .pages.jsonl)")
    ap.add_argument("--max-cer-increase", type=_fraction, default=None,
                    help="gate: CER increase in absolute terms, 0..1 (0.01 is one point)")
    ap.add_argument("--min-agreement", type=_fraction, default=None,
                    help="gate: minimum share of pages with identical tokens, 0..1")
    ap.add_argument("--no-resume", action="store_true", help="start over even if OUT.pages.jsonl exists")
    ap.add_argument("--reference-device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--candidate-device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--limit", type=positive_int, default=None, help="only the first N pages")
    ap.add_argument("--threads", type=positive_int, default=None, help="CPU threads per side (default: all cores)")
    ap.add_argument("--show-pages", action="store_true",
                    help="also print each page's ground truth beside both outputs (first 80 characters) with its CER")
    ap.add_argument("--max-pixels", type=int, default=None, metavar="N",
                    help=f"refuse images larger than N pixels, from their header (env {preprocess.MAX_PIXELS_ENV}; "
                         f"default {preprocess.DEFAULT_MAX_PIXELS:,})")


def main(args, open_runner=Runner) -> int:
    tty = sys.stderr.isatty()

    def progress(i, n, name, page, dt):
        if "error" in page:
            what = "error: " + page["error"]["message"]
        else:
            what = "same" if page["exact_match"] else f"differs at token {page['first_divergent_token']}"
        msg = f"[{i}/{n}] {name}: {what} ({dt:.1f} s)"
        print(("\r" + msg.ljust(70)) if tty else msg, end="" if tty and i < n else "\n", file=sys.stderr, flush=True)

    try:
        code, summary = run_check(args.reference, args.candidate, args.data, Path(args.out), args.task, args.lang,
                                  args.max_new_tokens, Gates(args.max_cer_increase, args.min_agreement),
                                  not args.no_resume, args.reference_device, args.candidate_device, args.limit,
                                  args.threads, progress, args.max_pixels, open_runner)
    except EdgeOCRError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    if args.show_pages:
        report = json.loads(Path(args.out).with_suffix(".json").read_text(encoding="utf-8"))
        print(format_pages(report) + "\n")
    print(format_summary(summary, summary["meta"]["reference"], summary["meta"]["candidate"]))
    if summary["resumed_pages"]:
        print(f"(resumed: {summary['resumed_pages']} page(s) taken from {Path(args.out).with_suffix('.pages.jsonl')})")
    print(f"reports: {Path(args.out).with_suffix('.json')}, {Path(args.out).with_suffix('.csv')}")
    if summary.get("other_settings_rows"):
        print(f"(the reports were rewritten for these settings; {Path(args.out).with_suffix('.pages.jsonl')} also "
              f"holds {summary['other_settings_rows']} page(s) of other settings (models, task, language or "
              "--max-new-tokens): give another --out to keep one report per setting)", file=sys.stderr)
    if code == EXIT_OK and summary["gates_passed"]:
        print("gates passed: " + "; ".join(summary["gates_passed"]))
    for f in summary["gates_failed"]:
        print(f"GATE FAILED: {f}", file=sys.stderr)
    if summary["errors"]:
        print(f"{summary['errors']} page(s) could not be read: their error rows are in the reports",
              file=sys.stderr)
    return code
