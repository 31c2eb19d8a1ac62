"""HTML document generator (quantize.htmldocs): DOM line boxes against rendered ink, wrapped paragraphs,
determinism, the command line.  Needs the system Chromium and Playwright (scripts/setup.sh installs both)."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
from PIL import Image

from edgeocr.dataset import load_dir
from quantize.htmldocs import GenOptions, generate, make_page
from quantize.htmldocs.content import Content
from quantize.htmldocs.layouts import KINDS
from quantize.htmldocs.render import RenderError, find_chromium


def _require_browser() -> None:
    try:
        find_chromium()
        importlib.import_module("playwright.sync_api")
    except (RenderError, ImportError) as e:
        pytest.fail(f"quantize.htmldocs needs Chromium and Playwright (run scripts/setup.sh as root): {e}")


@pytest.fixture(scope="module")
def renderer():
    _require_browser()
    from quantize.htmldocs.render import Renderer
    with Renderer() as r:
        yield r


def test_chromium_and_playwright_installed():
    _require_browser()


def _covered(shape, boxes, pad: int = 1) -> np.ndarray:
    m = np.zeros(shape, bool)
    for x0, y0, x1, y1 in boxes:
        m[max(0, y0 - pad):y1 + pad, max(0, x0 - pad):x1 + pad] = True
    return m


PLAIN = """<!doctype html><html><head><meta charset="utf-8"><style>
html, body {{ margin: 0; background: #fff; }} .page {{ width: 700px; padding: 30px; box-sizing: border-box;
font: 20px/1.5 'Liberation Serif', 'Noto Sans CJK SC'; color: #000; }}</style></head><body><div class="page">
<div class="t" style="width: 300px">{en}</div>
<div class="t" style="width: 260px; margin-top: 20px">{zh}</div>
<table style="margin-top: 20px"><tr><td class="t">Qty</td><td class="t">12.50</td><td class="t">金额 ¥1,024.00</td></tr></table>
</div></body></html>"""
EN = "The quick brown fox jumps over the lazy dog while 42 invoices wait for approval in the queue"
ZH = "根据合同约定，双方应于二零二六年十二月三日之前完成全部货物的交付与验收工作并开具发票"


def test_wrapped_paragraph_one_box_per_visual_line_on_plain_page(renderer):
    r = renderer.render(PLAIN.format(en=EN, zh=ZH), 700, 900)
    by_item = {}
    for ln in r.lines:
        by_item.setdefault(ln.item, []).append(ln)
    en, zh, cells = by_item[0], by_item[1], [by_item[k] for k in (2, 3, 4)]
    assert len(en) >= 3 and len(zh) >= 3                      # wrapped at 300 / 260 px
    assert " ".join(ln.text for ln in en) == EN
    assert "".join(ln.text for ln in zh) == ZH
    for lines, width in ((en, 300), (zh, 260)):
        for a, b in zip(lines, lines[1:]):
            assert a.box[3] <= b.box[1] + 1, (a, b)            # stacked, not overlapping
        assert all(ln.box[2] - ln.box[0] <= width + 2 for ln in lines)
        assert all(ln.box[0] <= 32 for ln in lines)             # every row starts at the left edge
    assert [c[0].text for c in cells] == ["Qty", "12.50", "金额 ¥1,024.00"]
    gray = r.image.min(axis=2)
    for ln in r.lines:
        x0, y0, x1, y1 = ln.box
        assert (gray[y0:y1, x0:x1] < 100).sum() >= 10, ln       # dark ink in every box
        assert gray[y0:y1, x0].min() < 200 and gray[y0:y1, x1 - 1].min() < 200, ln      # tight left/right
        assert gray[y0, x0:x1].min() < 200 and gray[y1 - 1, x0:x1].min() < 200, ln      # tight top/bottom
    outside = gray[~_covered(gray.shape, [ln.box for ln in r.lines])]
    assert outside.min() > 230                                   # nothing drawn outside the boxes


def test_text_outside_items_is_refused(renderer):
    with pytest.raises(RenderError, match="outside a .t item"):
        renderer.render('<html><body><div class="t">ok</div><p>loose text</p></body></html>', 400, 300)


def test_overflowing_and_overlapping_items_are_hidden_not_labelled(renderer):
    html = ('<html><body style="margin:0;font:20px \'DejaVu Sans\'">'
            '<div class="t" style="position:absolute;left:10px;top:10px">first item</div>'
            '<div class="t" style="position:absolute;left:30px;top:14px">overlapping item</div>'
            '<div class="t" style="position:absolute;left:10px;top:280px">below the page bottom</div>'
            '<div class="t" style="position:absolute;left:350px;top:100px;white-space:nowrap">past the right edge</div>'
            '</body></html>')
    r = renderer.render(html, 400, 300, 300)
    assert [ln.text for ln in r.lines] == ["first item"]
    gray = r.image.min(axis=2)
    assert gray[~_covered(gray.shape, [ln.box for ln in r.lines])].min() > 230      # the others are not drawn


@pytest.mark.parametrize("kind", list(KINDS))
def test_generated_boxes_cover_exactly_the_text_ink(renderer, kind):
    """Every label box holds text ink and visible contrast; the text-only render has no ink outside the
    boxes (no unlabelled text); box_norm is 0..1000 of the image."""
    for i in range(2):
        img, rec, r = make_page(renderer, i, 77, GenOptions(kinds=(kind,), degrade=False))
        assert rec["kind"] == kind and rec["source"] == "htmldocs" and rec["lines"], kind
        h, w = img.shape[:2]
        assert (rec["width"], rec["height"]) == (w, h) and 1000 <= max(w, h) <= 1600
        assert rec["text"] == "\n".join(ln["text"] for ln in rec["lines"])
        text_ink = r.text_only < 160
        gray = img.astype(np.int16).mean(axis=2)
        for ln in rec["lines"]:
            x0, y0, x1, y1 = ln["box"]
            assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h and ln["text"].strip(), ln
            assert text_ink[y0:y1, x0:x1].sum() >= 3, ln
            patch = gray[y0:y1, x0:x1]
            assert patch.max() - patch.min() > 30, ln                # visible (a thin "-" is the faintest)
            assert ln["box_norm"] == [int(x0 * 1000 / w), int(y0 * 1000 / h), int(x1 * 1000 / w), int(y1 * 1000 / h)]
        stray = text_ink & ~_covered(text_ink.shape, [ln["box"] for ln in rec["lines"]])
        assert stray.sum() <= 0.002 * text_ink.sum() + 5, (kind, i, int(stray.sum()), int(text_ink.sum()))
        squashed = "".join(rec["text"].split())
        for k, v in rec["fields"].items():
            assert "".join(v.split()) in squashed, (k, v)          # a value may wrap over lines


def test_same_seed_same_output_any_worker_count(tmp_path):
    _require_browser()
    a = generate(tmp_path / "a", 4, seed=11)
    generate(tmp_path / "b", 4, seed=11, workers=2)
    assert (tmp_path / "a/labels.jsonl").read_bytes() == (tmp_path / "b/labels.jsonl").read_bytes()
    assert all((tmp_path / "a" / r["image"]).read_bytes() == (tmp_path / "b" / r["image"]).read_bytes() for r in a)
    c = generate(tmp_path / "c", 4, seed=12)
    assert [r["text"] for r in a] != [r["text"] for r in c]


def test_command_line_writes_a_loadable_folder(tmp_path):
    _require_browser()
    from quantize.cli import main
    out = tmp_path / "pages"
    assert main(["htmldocs", str(out), "--count", "3", "--seed", "5", "--kinds", "invoice,reading"]) == 0
    samples = load_dir(out)
    assert [s.name for s in samples] == ["000000.jpg", "000001.jpg", "000002.jpg"]
    for s in samples:
        rec = s.label
        assert {"image", "id", "kind", "lang", "width", "height", "lines", "fields", "text", "targets"} <= set(rec)
        assert rec["kind"] in ("invoice", "reading") and rec["lang"] in ("zh", "en", "mixed")
        assert Image.open(s.path).size == (rec["width"], rec["height"])
        assert json.loads(rec["targets"]["spotting_json"])[0]["text"] == rec["lines"][0]["text"]
    assert main(["htmldocs", str(tmp_path / "x"), "--count", "1", "--kinds", "nope"]) == 2
    # WebP: the same page, fewer bytes, the same labels
    assert main(["htmldocs", str(tmp_path / "webp"), "--count", "1", "--seed", "5", "--kinds", "invoice,reading",
                 "--image-format", "webp", "--quality", "30"]) == 0
    (w,) = load_dir(tmp_path / "webp")
    assert w.name == "000000.webp" and Image.open(w.path).format == "WEBP"
    assert w.label["lines"] == samples[0].label["lines"]
    assert Image.open(w.path).size == Image.open(samples[0].path).size


def test_missing_chromium_is_a_clear_error(tmp_path, monkeypatch, capsys):
    from quantize.cli import main
    monkeypatch.setenv("EDGEOCR_CHROMIUM", str(tmp_path / "no-such-chromium"))
    with pytest.raises(RenderError, match="EDGEOCR_CHROMIUM"):
        find_chromium()
    assert main(["htmldocs", str(tmp_path / "o"), "--count", "1"]) == 2
    assert "no-such-chromium" in capsys.readouterr().err


def test_content_rarely_repeats():
    c = Content(np.random.default_rng(3), "mixed")
    for make in (c.company, c.name, lambda: " ".join(c.address()), c.product, c.doc_number, c.sentence):
        values = [make() for _ in range(300)]
        assert len(set(values)) >= 240, make


def test_committed_eval_html_set():
    """The held-out HTML set loads, is complete, is the documented seed and fits its size budget."""
    from pathlib import Path
    d = Path(__file__).resolve().parents[1] / "calibration_data" / "eval_html"
    samples = load_dir(d)
    assert len(samples) == 64 and all(s.label and s.label["lines"] and s.text for s in samples)
    assert {s.label["seed"] for s in samples} == {3003} and {s.label["source"] for s in samples} == {"htmldocs"}
    assert len({s.label["kind"] for s in samples}) >= 6
    assert sum(p.stat().st_size for p in d.iterdir()) <= 3_000_000


def test_tight_line_height_boxes_do_not_take_the_neighbours_ink(renderer):
    """At line-height 1.15 the font's content areas of stacked lines overlap; each box still holds only
    its own line's ink and no line is dropped as an overlap."""
    rows = ["根据合同约定双方应当", "Quality gyp 8421 Jg", "发票编号 INV-2026-0042", "pygmy quest 97531"]
    body = "".join(f'<div class="t">{r}</div>' for r in rows)
    html = (f'<html><body style="margin:0;background:#fff"><div style="padding:20px;font:40px/1.15 '
            f'\'Noto Sans CJK SC\';color:#000">{body}</div></body></html>')
    r = renderer.render(html, 700, 400, 300)
    assert [ln.text for ln in r.lines] == rows
    for a, b in zip(r.lines, r.lines[1:]):
        assert a.box[3] <= b.box[1] + 1, (a, b)
    assert all(ln.box[3] - ln.box[1] <= 44 for ln in r.lines)      # one line of 40 px type, not two


def test_screenshot_asks_again_when_chromium_has_no_frame():
    """Chromium's transient "Unable to capture screenshot" is retried after an animation frame; any other
    protocol error, or the transient one past SCREENSHOT_TRIES attempts, is raised."""
    import base64

    from playwright.sync_api import Error as PlaywrightError

    from quantize.htmldocs import render

    class FakeCdp:
        def __init__(self, errors):
            self.errors, self.calls = list(errors), 0

        def send(self, method, params):
            self.calls += 1
            if self.errors:
                raise PlaywrightError(self.errors.pop(0))
            return {"data": base64.b64encode(b"png").decode()}

    class FakePage:
        frames = 0

        def evaluate(self, js):
            FakePage.frames += 1

    r = render.Renderer.__new__(render.Renderer)
    r._page = FakePage()
    r._cdp = FakeCdp(["Protocol error (Page.captureScreenshot): Unable to capture screenshot"])
    assert r._screenshot(10, 10) == b"png" and r._cdp.calls == 2 and FakePage.frames == 1
    r._cdp = FakeCdp(["Protocol error: Target closed"])
    with pytest.raises(PlaywrightError, match="Target closed"):
        r._screenshot(10, 10)
    r._cdp = FakeCdp(["Unable to capture screenshot"] * render.SCREENSHOT_TRIES)
    with pytest.raises(PlaywrightError, match="Unable to capture"):
        r._screenshot(10, 10)
    assert r._cdp.calls == render.SCREENSHOT_TRIES
