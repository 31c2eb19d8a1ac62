"""The accuracy checker: metrics on hand-made cases, reports, exit codes, resume."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgeocr import metrics
from edgeocr.check import Gates, check_gates, summarize


def test_metrics_hand_made():
    assert metrics.levenshtein("kitten", "sitting") == 3
    assert metrics.cer("abcd", "abcd") == 0.0
    assert metrics.cer("abxd", "abcd") == 0.25
    assert metrics.cer("", "abcd") == 1.0 and metrics.cer("x", "") == 1.0 and metrics.cer("", "") == 0.0
    assert metrics.ned("abc", "abcdef") == 0.5
    assert metrics.cer("合计¥1,234.00", "合计¥1,284.00") == pytest.approx(1 / 11)
    out = 'Sure: ```json\n{"total": "1,234.00", "date": "2026-12-02"}\n```'
    assert metrics.field_accuracy(out, {"total": "1,234.00", "date": "2026-12-03"}) == 0.5
    assert metrics.field_accuracy("no json here", {"a": "1"}) == 0.0
    assert metrics.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert metrics.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert metrics.first_divergence([1, 2], [1, 2, 3]) == 2


def test_whitespace_free_cer_hand_made():
    # line breaks, spaces, tabs and U+3000 do not count; the denominator is the label without whitespace
    assert metrics.strip_whitespace(" a\tb\nc\u3000d \r\n") == "abcd"
    assert metrics.cer("ab c\nd", "abcd") == 0.5 and metrics.cer_nows("ab c\nd", "abcd") == 0.0
    assert metrics.cer_nows("abxd", "a b\nc d") == 0.25
    assert metrics.cer_nows("abc", "a b c d e") == 0.4               # 2 deletions / 5
    assert metrics.cer_nows("合计\u3000100", "合计 100") == 0.0
    assert metrics.cer_nows("", " \n\t") == 0.0 and metrics.cer_nows("x", "  ") == 1.0
    assert metrics.cer_nows("", "ab\ncd") == 1.0
    # full-width forms differ from ASCII until NFKC folds them
    assert metrics.cer_nows("ＴＯＴＡＬ：１２", "TOTAL: 12") == 1.0        # 8 substitutions / 8
    assert metrics.cer_nows_nfkc("ＴＯＴＡＬ：１２", "TOTAL: 12") == 0.0
    assert metrics.cer_nows_nfkc("ＡＢ Ｃ", "A B X") == pytest.approx(1 / 3)
    hyp, ref = "发票号码：12345\n金额", "发票号码: 12345 金额"
    assert metrics.cer(hyp, ref) == pytest.approx(3 / 14)     # '：' for ':', the space after it, newline for space
    assert metrics.cer_nows(hyp, ref) == pytest.approx(1 / 12) and metrics.cer_nows_nfkc(hyp, ref) == 0.0


def test_reference_text_from_lines(tmp_path):
    from edgeocr.dataset import load_dir
    from PIL import Image
    for n in ("a.png", "b.png", "c.png"):
        Image.new("RGB", (8, 8), "white").save(tmp_path / n)
    recs = [{"image": "a.png", "lines": [{"text": "Line 1", "box": [0, 0, 4, 2]}, {"text": "行二", "box": [0, 3, 4, 5]}]},
            {"image": "b.png", "text": "given", "lines": [{"text": "other", "box": [0, 0, 1, 1]}]},
            {"image": "c.png", "kind": "receipt"}]
    (tmp_path / "labels.jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in recs), encoding="utf-8")
    assert [s.text for s in load_dir(tmp_path)] == ["Line 1\n行二", "given", None]


def test_spotting_box_scores_hand_made():
    assert metrics.box_iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert metrics.box_iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(50 / 150)
    assert metrics.box_iou([0, 0, 10, 10], [20, 20, 30, 30]) == 0.0
    gold = [[0, 0, 100, 20], [0, 30, 100, 50]]
    # one exact hit, one box half off (IoU 1/3), one spurious prediction: matched one to one
    pred = [[0, 30, 100, 50], [50, 0, 150, 20], [300, 300, 310, 310]]
    sc = metrics.spotting_scores(pred, gold)
    assert sc["mean_iou"] == pytest.approx((1 + 1 / 3) / 2)
    assert sc["recall"] == 0.5 and sc["precision"] == pytest.approx(1 / 3) and sc["f1"] == pytest.approx(0.4)
    assert metrics.spotting_scores([], gold) == {"mean_iou": 0.0, "precision": 0.0, "recall": 0.0, "f1": 0.0}
    # a duplicate of the same box cannot match twice
    assert metrics.spotting_scores([[0, 0, 100, 20]] * 2, gold[:1])["precision"] == 0.5


def _page(name, match, cer_r, cer_c):
    side = lambda c: {"cer": c, "ned": c, "repetition": False, "truncated": False, "timings_ms": {"total": 10.0}}
    return {"image": name, "exact_match": match, "first_divergent_token": None if match else 3, "pair_ned": 0.0,
            "reference": side(cer_r), "candidate": side(cer_c)}


def test_summary_and_gates():
    s = summarize([_page("a", True, 0.1, 0.1), _page("b", False, 0.1, 0.2)])
    assert s["exact_agreement"] == 0.5 and s["cer_increase"] == pytest.approx(0.05)
    assert check_gates(s, Gates(max_cer_increase=0.1)) == []
    assert check_gates(s, Gates(max_cer_increase=0.01))
    assert check_gates(s, Gates(min_agreement=0.9))


def _check(*args):
    return subprocess.run([sys.executable, "-m", "edgeocr", "check", *args], capture_output=True, text=True, timeout=600)


def test_cli_reports_exit_codes_and_resume(art_a, art_b, tmp_path):
    from pathlib import Path
    data = Path(__file__).resolve().parents[1] / "calibration_data" / "eval"
    out = tmp_path / "rep"
    base = ["--data", str(data), "--limit", "3", "--max-new-tokens", "6", "--out", str(out)]
    r = _check("--reference", str(art_a), "--candidate", str(art_a), *base, "--max-cer-increase", "0")
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.with_suffix(".json").read_text())
    assert rep["summary"]["pages"] == 3 and rep["summary"]["exact_agreement"] == 1.0
    assert all(p["first_divergent_token"] is None for p in rep["pages"])
    assert rep["pages"][0]["reference"]["cer"] > 0            # random weights do not read
    assert "CER" in r.stdout and out.with_suffix(".csv").read_text().count("\n") == 4
    assert "gates passed: CER increase 0.00 points <= 0.00" in r.stdout
    # whitespace-free CER and its NFKC variant, per page, in the summary, the CSV and the printed table
    from edgeocr.dataset import load_dir
    refs = {s.name: s.text for s in load_dir(data)[:3]}
    for p in rep["pages"]:
        for side in ("reference", "candidate"):
            d = p[side]
            assert d["cer_nows"] == metrics.cer_nows(d["text"], refs[p["image"]])
            assert d["cer_nows_nfkc"] == metrics.cer_nows_nfkc(d["text"], refs[p["image"]])
            assert d["cer_nows"] > 0
    for key in ("cer_nows", "cer_nows_nfkc"):
        assert rep["summary"]["candidate"][key] == pytest.approx(sum(p["candidate"][key] for p in rep["pages"]) / 3)
    header = out.with_suffix(".csv").read_text().splitlines()[0].split(",")
    assert {"reference_cer_nows", "reference_cer_nows_nfkc", "candidate_cer_nows", "candidate_cer_nows_nfkc"} <= set(header)
    assert "CER, no whitespace" in r.stdout and "CER, NFKC, no ws" in r.stdout
    # resume: the finished pages are taken from the progress file, nothing is recomputed
    r = _check("--reference", str(art_a), "--candidate", str(art_a), *base)
    assert r.returncode == 0 and "resumed: 3 page(s)" in r.stdout and "[1/3]" not in r.stderr
    assert "gates passed" not in r.stdout and "other settings" not in r.stderr       # no gate given
    # other settings on the same --out (here --max-new-tokens): nothing resumed, and the run says the reports
    # were rewritten while the progress file keeps the other rows
    r = _check("--reference", str(art_a), "--candidate", str(art_a), *base[:-4], "--max-new-tokens", "5",
               "--out", str(out))
    assert r.returncode == 0 and "resumed" not in r.stdout and "holds 3 page(s) of other settings" in r.stderr
    # an interrupted run (progress file holds 1 page + a torn line) finishes the rest only
    lines = out.with_suffix(".pages.jsonl").read_text().splitlines()
    out.with_suffix(".pages.jsonl").write_text(lines[0] + "\n" + lines[1][:40])
    r = _check("--reference", str(art_a), "--candidate", str(art_a), *base)
    assert r.returncode == 0 and "resumed: 1 page(s)" in r.stdout and "[2/3]" in r.stderr
    # the same file names with other images (another data set, same --out): nothing is taken from the report
    import shutil
    other = tmp_path / "other"
    other.mkdir()
    for i in range(3):
        shutil.copy(data / f"{i + 3:06d}.jpg", other / f"{i:06d}.jpg")
    r = _check("--reference", str(art_a), "--candidate", str(art_a), "--data", str(other), "--max-new-tokens", "6",
               "--out", str(out))
    assert r.returncode == 0 and "resumed" not in r.stdout and "[1/3]" in r.stderr, r.stdout
    # two different models disagree: the agreement gate fails with its own exit code
    r = _check("--reference", str(art_a), "--candidate", str(art_b), *base, "--no-resume", "--min-agreement", "0.99")
    assert r.returncode == 3 and "GATE FAILED" in r.stderr
    r = _check("--reference", str(art_a), "--candidate", str(tmp_path), *base)
    assert r.returncode == 1 and "no manifest.json" in r.stderr
    r = _check("--reference", str(art_a))
    assert r.returncode == 2
    for gate, value in (("--max-cer-increase", "1.5"), ("--min-agreement", "50"), ("--max-cer-increase", "-0.1")):
        r = _check("--reference", str(art_a), "--candidate", str(art_a), *base, gate, value)   # a gate that could
        assert r.returncode == 2 and "is not a fraction in 0..1" in r.stderr, (gate, value)   # never fail, refused
    r = _check("--reference", str(art_a), "--candidate", str(art_a), "--data", str(data), "--limit", "0")
    assert r.returncode == 2 and "'0' is not a positive integer" in r.stderr


def test_unreadable_pages_are_error_rows_and_the_run_goes_on(art_a, tmp_path):
    import shutil
    from pathlib import Path

    from PIL import Image
    eval_dir = Path(__file__).resolve().parents[1] / "calibration_data" / "eval"
    data = tmp_path / "data"
    data.mkdir()
    for n in ("000000.jpg", "000001.jpg", "000002.jpg"):
        shutil.copy(eval_dir / n, data / n)
    (data / "000003.jpg").write_bytes((eval_dir / "000003.jpg").read_bytes()[:300])      # truncated
    Image.new("RGB", (8, 8), "white").save(data / "000004.png")                           # under the minimum
    shutil.copy(eval_dir / "000005.jpg", data / "000005.jpg")
    out = tmp_path / "rep"
    args = ["--reference", str(art_a), "--candidate", str(art_a), "--data", str(data), "--max-new-tokens", "2",
            "--out", str(out)]
    r = _check(*args)
    assert r.returncode == 1, r.stderr
    rep = json.loads(out.with_suffix(".json").read_text())
    assert rep["summary"]["pages"] == 4 and rep["summary"]["errors"] == 2
    errs = {p["image"]: p["error"] for p in rep["pages"] if "error" in p}
    assert "truncated or corrupt" in errs["000003.jpg"]["message"]
    assert errs["000004.png"]["type"] == "PageTooSmall"
    assert "[6/6] 000005.jpg: same" in r.stderr and "(2 more could not be read)" in r.stdout
    assert "2 page(s) could not be read" in r.stderr
    assert out.with_suffix(".csv").read_text().count("\n") == 7
    # resume: the pages read are kept, the error rows are tried again (fixed file now reads)
    shutil.copy(eval_dir / "000003.jpg", data / "000003.jpg")
    r = _check(*args)
    rep = json.loads(out.with_suffix(".json").read_text())
    assert r.returncode == 1 and rep["summary"]["pages"] == 5 and rep["summary"]["errors"] == 1
    assert "resumed: 4 page(s)" in r.stdout


def test_format_pages_puts_truth_beside_each_side_with_cer():
    from edgeocr.check import format_pages
    side = {"text": "TOTAL 12\nTAX 1", "cer": 0.25, "cer_nows": 0.2, "timings_ms": {"per_token": 2.0, "total": 100.0}}
    report = {"pages": [{"image": "a.jpg", "truth": "TOTAL 12\nTAX 2" + "x" * 200, "reference": side,
                         "candidate": dict(side, cer=0.5)},
                        {"image": "b.jpg", "error": {"type": "ImageError", "message": "b.jpg: truncated"}}],
              "summary": {"errors": 1, "reference": {"cer": 0.25, "cer_nows": 0.2, "mean_total_ms": 100.0},
                          "candidate": {"cer": 0.5, "cer_nows": 0.2, "mean_total_ms": 100.0}}}
    lines = format_pages(report, ("FP32", "INT8"), width=20).splitlines()
    assert lines[0] == "a.jpg"
    assert lines[1].endswith("  TOTAL 12 ⏎ TAX 2xxx…") and len(lines[1].split("  ")[-1]) == 20
    assert lines[2] == "  FP32   CER  25.0%  no-ws  20.0%  TOTAL 12 ⏎ TAX 1"
    assert lines[3].startswith("  INT8   CER  50.0%")
    assert lines[5] == "  error  b.jpg: truncated"
    assert lines[6] == "FP32     mean CER 25.0% (no whitespace 20.0%); 2.00 ms/token, 100 ms/page"
    assert lines[-1] == "1 page(s) could not be read"


def test_transformers_side_is_the_toolchains(art_a, ckpt_a, tmp_path):
    """`edgeocr check` runs artifacts only and says where hf:CHECKPOINT went; `python -m quantize compare` takes
    it as a side (same reports): on the tiny model in FP32 both sides pick the same tokens."""
    from pathlib import Path
    data = Path(__file__).resolve().parents[1] / "calibration_data" / "eval"
    out = tmp_path / "hf"
    args = ["--reference", f"hf:{ckpt_a}", "--candidate", str(art_a), "--data", str(data), "--limit", "2",
            "--max-new-tokens", "4", "--out", str(out)]
    r = _check(*args)
    assert r.returncode == 1 and "python -m quantize compare" in r.stderr and "hf:" in r.stderr
    r = subprocess.run([sys.executable, "-m", "quantize", "compare", *args, "--min-agreement", "1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(out.with_suffix(".json").read_text())
    assert rep["meta"]["reference"] == f"transformers:{ckpt_a.name}" and rep["summary"]["pages"] == 2
    assert rep["summary"]["exact_agreement"] == 1.0
    r = subprocess.run([sys.executable, "-m", "quantize", "compare", *args[:1], f"hf:{tmp_path}", *args[2:]],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1 and "no config.json" in r.stderr
