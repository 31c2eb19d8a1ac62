"""calibration_data generator and the data-directory loader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgeocr.dataset import DatasetError, load_dir
from quantize.docgen import GenOptions, generate, make_document
from quantize.docgen.content import cn_id_check, mrz_check, rmb_uppercase, uscc_check
from quantize.docgen.layouts import KINDS

REPO = Path(__file__).resolve().parents[1]


def test_same_seed_same_bytes(tmp_path):
    a = generate(tmp_path / "a", 12, seed=42)
    b = generate(tmp_path / "b", 12, seed=42)
    assert (tmp_path / "a/labels.jsonl").read_bytes() == (tmp_path / "b/labels.jsonl").read_bytes()
    assert all((tmp_path / "a" / r["image"]).read_bytes() == (tmp_path / "b" / r["image"]).read_bytes() for r in a)
    c = generate(tmp_path / "c", 12, seed=43)
    assert [r["text"] for r in a] != [r["text"] for r in c]
    assert [r["text"] for r in a] == [r["text"] for r in b]


@pytest.mark.parametrize("kind", list(KINDS))
def test_boxes_inside_image_and_cover_ink(kind):
    """Clean render: every box lies in the image, holds ink, and is tight around it."""
    for i in range(3):
        img, rec = make_document(i, 5, GenOptions(kinds=(kind,), degrade=False))
        a = np.asarray(img.convert("L"), dtype=np.int16)
        bg = int(np.median(a))
        assert rec["kind"] == kind and rec["lines"], kind
        for ln in rec["lines"]:
            x1, y1, x2, y2 = ln["box"]
            assert 0 <= x1 < x2 <= img.width and 0 <= y1 < y2 <= img.height, ln
            ink = np.abs(a[y1:y2, x1:x2] - bg) > 60
            assert ink.sum() >= 4, ln
            ys, xs = np.nonzero(ink)
            # ink reaches close to every edge of the box (box is tight, not a loose guess)
            tol = max(3, (y2 - y1) // 4)
            assert xs.min() <= tol and ys.min() <= tol and xs.max() >= x2 - x1 - 1 - tol and ys.max() >= y2 - y1 - 1 - tol, ln
            b = ln["box_norm"]
            assert all(0 <= v <= 1000 for v in b)


def test_degraded_boxes_stay_in_image_and_on_ink():
    seen = set()
    for i in range(40):
        img, rec = make_document(i, 9, GenOptions(degrade=True, degrade_prob=1.0))
        seen.update(rec["degradations"])
        a = np.asarray(img.convert("L"), dtype=np.int16)
        for ln in rec["lines"]:
            x1, y1, x2, y2 = ln["box"]
            assert 0 <= x1 < x2 <= img.width and 0 <= y1 < y2 <= img.height
            patch = a[y1:y2, x1:x2]
            assert patch.max() - patch.min() > 40, ln          # something is drawn there
    assert {"stamp", "perspective", "blur", "noise", "jpeg", "lighting", "fold"} <= seen


def test_targets_in_hunyuan_formats():
    _, rec = make_document(0, 1, GenOptions(kinds=("invoice_en",), degrade=False))
    t = rec["targets"]
    assert t["structured_parse"] == rec["text"] == "\n".join(ln["text"] for ln in rec["lines"])
    first = rec["lines"][0]
    x1, y1, x2, y2 = first["box_norm"]
    assert t["spotting"].startswith(f"{first['text']}({x1},{y1}),({x2},{y2})")
    assert json.loads(t["spotting_json"])[0] == {"box": first["box_norm"], "text": first["text"]}
    assert json.loads(t["fields_json"]) == rec["fields"] and "total" in rec["fields"]


def test_digit_dense_fields_are_valid():
    from decimal import Decimal
    assert rmb_uppercase(Decimal("100500.30")) == "壹拾万零伍佰圆叁角整"
    assert rmb_uppercase(Decimal("1004")) == "壹仟零肆圆整"
    assert rmb_uppercase(Decimal("10.05")) == "壹拾圆零伍分"
    assert cn_id_check("11010519491231002") == "X"           # GB 11643 example
    assert mrz_check("L898902C3") == "6"                      # ICAO 9303 example
    assert uscc_check("91350100M000100Y4") == "3"
    for i in range(30):
        _, rec = make_document(i, 3, GenOptions(kinds=("id_card", "vat_invoice_cn"), degrade=False))
        f = rec["fields"]
        if "公民身份号码" in f:
            idn = f["公民身份号码"]
            assert idn.startswith("99") and cn_id_check(idn[:17]) == idn[17]   # fake region, valid check digit
            assert any("SPECIMEN" in ln["text"] for ln in rec["lines"])
        if "价税合计大写" in f:
            assert rmb_uppercase(Decimal(f["价税合计小写"])) == f["价税合计大写"]
            assert uscc_check(f["销售方纳税人识别号"][:17]) == f["销售方纳税人识别号"][17]


def test_loader_round_trip(tmp_path):
    recs = generate(tmp_path, 6, seed=8)
    samples = load_dir(tmp_path)
    assert [s.name for s in samples] == [r["image"] for r in recs]
    assert [s.text for s in samples] == [r["text"] for r in recs]
    assert [s.fields for s in samples] == [r["fields"] for r in recs]
    for s, r in zip(samples, recs):
        assert Image.open(s.path).size == (r["width"], r["height"])


def test_loader_csv_and_unlabelled(tmp_path):
    Image.new("RGB", (10, 10)).save(tmp_path / "a.png")
    Image.new("RGB", (10, 10)).save(tmp_path / "b.png")
    assert [s.label for s in load_dir(tmp_path)] == [None, None]
    (tmp_path / "labels.csv").write_text('image,text,fields\na.png,hello,"{""k"": ""v""}"\n', encoding="utf-8")
    s = load_dir(tmp_path)
    assert s[0].text == "hello" and s[0].fields == {"k": "v"} and s[1].label is None   # kept, not dropped


def test_loader_errors(tmp_path):
    with pytest.raises(DatasetError, match="not a directory"):
        load_dir(tmp_path / "nope")
    with pytest.raises(DatasetError, match="no images"):
        load_dir(tmp_path)
    Image.new("RGB", (10, 10)).save(tmp_path / "a.png")
    lab = tmp_path / "labels.jsonl"
    lab.write_text('{"image": "a.png", "text": "x"}\n{broken\n')
    with pytest.raises(DatasetError, match=r"labels.jsonl:2: not valid JSON"):
        load_dir(tmp_path)
    lab.write_text('{"text": "x"}\n')
    with pytest.raises(DatasetError, match=r"labels.jsonl:1: missing 'image'"):
        load_dir(tmp_path)
    lab.write_text('{"image": "zz.png"}\n')
    with pytest.raises(DatasetError, match=r"not in .*'zz.png'"):
        load_dir(tmp_path)
    lab.write_text('{"image": "a.png"}\n{"image": "a.png"}\n')
    with pytest.raises(DatasetError, match="labelled twice"):
        load_dir(tmp_path)
    lab.write_text('{"image": "a.png", "lines": [{"text": "t", "box": [1, 2]}]}\n')
    with pytest.raises(DatasetError, match=r"lines\[0\].box"):
        load_dir(tmp_path)
    lab.unlink()
    (tmp_path / "labels.csv").write_text("file,text\na.png,x\n")
    with pytest.raises(DatasetError, match="'image' column"):
        load_dir(tmp_path)


@pytest.mark.parametrize("split,n", [("calib", 128), ("eval", 64)])
def test_committed_sets(split, n):
    """The shipped sets load, are complete, and eval never overlaps calibration."""
    samples = load_dir(REPO / "calibration_data" / split)
    assert len(samples) == n and all(s.label and s.text for s in samples)
    if split == "eval":
        calib = {s.text for s in load_dir(REPO / "calibration_data" / "calib")}
        assert not calib & {s.text for s in samples}


def test_cli_reports_fonts_and_speed(tmp_path):
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "quantize.docgen", "--out", str(tmp_path / "o"), "-n", "5", "--seed", "1",
                        "--kinds", "receipt,menu"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "fonts found:" in p.stderr and "docs/s" in p.stderr
    p = subprocess.run([sys.executable, "-m", "quantize.docgen", "--out", str(tmp_path / "o"), "--kinds", "poster"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "unknown kind" in p.stderr


def test_subset_fonts_render_like_the_originals(tmp_path, monkeypatch):
    """--subset-fonts: each written face renders the generator's characters exactly like the original
    (checked inside, and again here on a sample line), and is found through EDGEOCR_FONT_DIR alone."""
    import quantize.docgen.fonts as F

    full = F.discover()
    pick = [f for f in full.faces if f.name in ("WenQuanYi Micro Hei", "Liberation Sans", "AR PL UMing CN")]
    assert len(pick) >= 2, full.report()
    written = F.subset_fonts(str(tmp_path), F.FontSet(tuple(pick), ()))
    by_name = {n: cut for n, _, cut in written}
    assert by_name["wqy-microhei.face0.otf"] and by_name["LiberationSans-Regular.face0.otf"]
    assert sum(s for _, s, cut in written if cut) < 400_000          # subsets, not the 5 MB collection
    text = "发票号码：30506015 合计¥179822.62 TRACKING #: 1Z197185908249"
    for face in pick:
        if face.name == "AR PL UMing CN":
            continue
        sub = str(tmp_path / F.face_file(dict((n, r) for n, r, *_ in F.CATALOG)[face.name], face.index))
        a = Image.new("L", (900, 40), 255)
        b = Image.new("L", (900, 40), 255)
        from PIL import ImageDraw, ImageFont
        ImageDraw.Draw(a).text((2, 2), text, font=ImageFont.truetype(face.path, 20, index=face.index), fill=0)
        ImageDraw.Draw(b).text((2, 2), text, font=ImageFont.truetype(sub, 20), fill=0)
        assert a.tobytes() == b.tobytes(), face.name
    # found through the flat folder alone, under the catalog's names
    monkeypatch.setattr(F, "FONT_DIRS", ())
    monkeypatch.setenv(F.FONT_DIR_ENV, str(tmp_path))
    F.discover.cache_clear()
    try:
        found = {f.name for f in F.discover().faces}
    finally:
        F.discover.cache_clear()
    assert {f.name for f in pick} <= found
