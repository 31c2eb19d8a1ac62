"""scripts/peer_compare.py: RapidOCR's reading order, and a run on two eval pages with RapidOCR and the demo
model's FP16 artifact (scores recomputed from the texts it wrote, resume without recomputing)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgeocr import metrics
from edgeocr.dataset import load_dir

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "peer_compare.py"
EVAL = ROOT / "calibration_data" / "eval"


def _module():
    spec = importlib.util.spec_from_file_location("peer_compare", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _box(x1, y1, x2, y2, rise=0.0):
    """A quadrilateral as RapidOCR gives it (TL, TR, BR, BL), its right side `rise` px higher."""
    return [[x1, y1], [x2, y1 - rise], [x2, y2 - rise], [x1, y2]]


def test_rapidocr_reading_order():
    lines = _module().rapidocr_lines
    # given out of order: rows top to bottom, boxes left to right, a row's boxes joined by a space
    res = [(_box(300, 52, 400, 72), "12.00", 0.9), (_box(10, 10, 200, 30), "Title", 0.9),
           (_box(10, 50, 120, 70), "Coffee", 0.9), (_box(10, 90, 120, 110), "Tea", 0.9),
           (_box(300, 88, 400, 108), "8.50", 0.9)]
    assert lines(res) == "Title\nCoffee 12.00\nTea 8.50"
    # a page tilted so rows rise 16 px over 800 px (more than half a row's height): rows still hold together
    tilt = 0.02
    res = [(_box(x, y - tilt * x, x + 100, y + 20 - tilt * x, rise=tilt * 100), t, 0.9)
           for x, y, t in [(700, 100, "B1"), (0, 100, "A1"), (700, 130, "B2"), (0, 130, "A2"), (350, 115, "M")]]
    assert lines(res) == "A1 B1\nM\nA2 B2"
    assert lines([]) == "" and lines(None) == ""


@pytest.fixture(scope="module")
def demo_fp16(tmp_path_factory):
    from quantize.export import ExportOptions, export
    out = tmp_path_factory.mktemp("demo") / "fp16"
    export(ROOT / "demo_model", out, ExportOptions(cache_len=1536, prefill_len=1280, precision="fp16"))
    return out


def _run(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=ROOT)


def test_two_pages_rapidocr_and_demo_fp16(demo_fp16, tmp_path):
    try:
        import rapidocr_onnxruntime  # noqa: F401
    except ImportError:
        pytest.fail("needs RapidOCR: pip install -e '.[peer]' (scripts/setup.sh does)")
    md, js = tmp_path / "peer.md", tmp_path / "peer.json"
    base = ["--data", str(EVAL), "--limit", "2", "--systems", "rapidocr,fp16", "--fp16", str(demo_fp16),
            "--max-new-tokens", "64", "--out-md", str(md), "--out-json", str(js)]
    r = _run(*base)
    assert r.returncode == 0, r.stderr
    rep = json.loads(js.read_text(encoding="utf-8"))
    refs = {s.name: s.text for s in load_dir(EVAL)[:2]}
    assert [p["image"] for p in rep["pages"]] == list(refs) and set(rep["systems"]) == {"rapidocr", "fp16"}
    assert rep["systems"]["fp16"]["precision"] == "fp16"
    for p in rep["pages"]:
        for name, d in p["systems"].items():
            ref = refs[p["image"]]
            assert d["cer_nows"] == metrics.cer_nows(d["text"], ref)
            assert d["cer_nows_nfkc"] == metrics.cer_nows_nfkc(d["text"], ref)
            assert d["cer"] == metrics.cer(d["text"], ref)
        assert p["systems"]["fp16"]["tokens"] <= 64
        assert p["systems"]["rapidocr"]["cer_nows"] < 0.1      # it reads these pages (measured 0.024, 0.000)
    for name in ("rapidocr", "fp16"):
        s = rep["summary"][name]
        vals = [p["systems"][name]["cer_nows"] for p in rep["pages"]]
        assert s["pages"] == 2 and s["cer_nows"]["mean"] == pytest.approx(sum(vals) / 2)
        assert s["cer_nows"]["median"] == pytest.approx(sum(vals) / 2)        # two pages: the same
    # 64 tokens cannot cover a page: the demo model is far behind RapidOCR here
    assert rep["summary"]["fp16"]["cer_nows"]["mean"] > rep["summary"]["rapidocr"]["cer_nows"]["mean"] + 0.3
    table = md.read_text(encoding="utf-8")
    assert "| RapidOCR (rapidocr_onnxruntime 1.4.4) | 2 |" in table and "| edgeocr fp16 (fp16, fp16) | 2 |" in table
    assert f"{rep['summary']['rapidocr']['cer_nows']['mean'] * 100:.1f} %" in table
    assert "| shipping_label | 1 |" in table and "| table | 1 |" in table       # by kind: 000000, 000001
    # resume: the same systems and settings are taken from the JSON, nothing runs again
    r = _run(*base, "--resume")
    assert r.returncode == 0 and "[1/2]" not in r.stderr, r.stderr
    assert json.loads(js.read_text(encoding="utf-8"))["pages"] == rep["pages"]
    # a system that needs an artifact refuses to start without one
    r = _run("--data", str(EVAL), "--systems", "int8", "--out-md", str(md), "--out-json", str(js))
    assert r.returncode == 2 and "--int8" in r.stderr


def test_reading_order_diagnosis_tells_lost_places_from_misreads(tmp_path):
    """scripts/diag_reading_order.py: an output in the page's order scores in order 1; the same cells shuffled and
    repeated score low on order and high on repetition with the same precision; an invented cell lowers precision."""
    spec = importlib.util.spec_from_file_location("diag_reading_order", ROOT / "scripts" / "diag_reading_order.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    label = {"lines": [{"text": "Date Amount"}, {"text": "2024-01-02 15.00"}, {"text": "2024-01-03 7.50"}]}
    read = mod.page_stats("Date Amount\n2024-01-02 15.00\n2024-01-03 7.50", label)
    assert read["precision"] == 1 and read["recall"] == 1 and read["in_order"] == 1 and read["repeated"] == 0
    lost = mod.page_stats("Date 7.50\n2024-01-02 Amount\n7.50 2024-01-02", label)
    assert lost["precision"] == 1 and lost["repeated"] == 2 / 6 and lost["in_order"] < 0.5
    invented = mod.page_stats("Date Amount\n2024-01-09 15.00", label)
    assert invented["precision"] == 3 / 4 and invented["first_miss"] == 2
    page = {"image": "a.jpg", "systems": {"m": {"text": "Date Amount", "cer_nows": 0.5}}}
    res = {"systems": {"m": {}}, "pages": [page]}
    (tmp_path / "r.json").write_text(json.dumps(res))
    (tmp_path / "labels.jsonl").write_text(json.dumps({"image": "a.jpg", **label}) + "\n")
    assert mod.main([str(tmp_path / "r.json"), "--data", str(tmp_path), "--json", str(tmp_path / "o.json")]) == 0
    got = json.loads((tmp_path / "o.json").read_text())["systems"]["m"]
    assert got["pages"] == 1 and got["precision"] == 1 and got["recall"] == 2 / 6
