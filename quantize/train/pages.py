"""One training page, wherever it comes from: a generated business document, a random-line reading page,
or a labelled image from a folder (calibration_data format).  Each becomes a `Page`: the letterboxed
1024x1024 canvas the runtime feeds the encoder, its reading-order text, and its lines with boxes in canvas
pixels.  From a page come the training targets: full text, spotting under a shift, and the characters'
positions the glyph loss reads.  These functions run in the rendering processes (numpy and Pillow only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from edgeocr.preprocess import CANVAS, letterbox, load_image

TASKS = ("structured_parse", "spotting")        # full text, lines with 0-1000 boxes of the canvas


@dataclass(frozen=True)
class Page:
    canvas: np.ndarray          # [S, S, 3] uint8, letterboxed (top-left, white padding)
    text: str                   # reading-order full text
    lines: tuple                # ((text, (x1, y1, x2, y2)), ...) boxes in canvas pixels


def spotting_target(page: Page, shift: tuple[int, int] = (0, 0)) -> str:
    """The spotting answer for `page` drawn `shift` = (dx, dy) canvas pixels away: each line as
    `text(x1,y1),(x2,y2)` in 0..1000 of the canvas."""
    dx, dy = shift
    k = 1000 / CANVAS
    out = []
    for text, (x1, y1, x2, y2) in page.lines:
        b = [min(1000, max(0, int((v + d) * k))) for v, d in ((x1, dx), (y1, dy), (x2, dx), (y2, dy))]
        out.append(f"{text}({b[0]},{b[1]}),({b[2]},{b[3]})")
    return "".join(out)


def shift_range(page: Page, max_shift: int) -> tuple[int, int, int, int]:
    """(dx_min, dx_max, dy_min, dy_max): shifts within +-max_shift that keep every labelled line on the canvas."""
    if not page.lines:
        return -max_shift, max_shift, -max_shift, max_shift
    boxes = np.asarray([b for _, b in page.lines], np.float64)
    x1, y1 = boxes[:, 0].min(), boxes[:, 1].min()
    x2, y2 = boxes[:, 2].max(), boxes[:, 3].max()
    return (int(max(-max_shift, -np.floor(x1))), int(min(max_shift, np.floor(CANVAS - 1 - x2))),
            int(max(-max_shift, -np.floor(y1))), int(min(max_shift, np.floor(CANVAS - 1 - y2))))


@lru_cache(maxsize=1)
def charset_index() -> dict:
    """Character -> class of the glyph loss (the generator's charset, sorted); built once per process."""
    from quantize.docgen.fonts import generator_charset
    return {c: i for i, c in enumerate(sorted(generator_charset()))}


def char_points(page: Page, limit: int) -> np.ndarray:
    """The page's characters in reading order as [limit, 3] int16 rows (x, y, class): the centre each
    character gets along its line's box by width class (CJK 2, others 1), in canvas pixels, and its index
    in the generator's charset (len(charset) for any other character).  Spaces are skipped; rows past the
    characters are (0, 0, -1).  The glyph loss's targets are built from these on the device."""
    index = charset_index()
    other = len(index)
    rows = []
    for text, (x1, y1, x2, y2) in page.lines:
        widths = np.asarray([2 if ord(c) > 0x2E80 else 1 for c in text], np.float64)
        if not len(widths):
            continue
        centre = x1 + (x2 - x1) * (np.cumsum(widths) - widths / 2) / widths.sum()
        yc = (y1 + y2) / 2
        rows += [(xc, yc, index.get(c, other)) for c, xc in zip(text, centre) if not c.isspace()]
    out = np.zeros((limit, 3), np.int16)
    out[:, 2] = -1
    rows = rows[:limit]
    if rows:
        out[:len(rows)] = np.asarray(rows, np.float64).astype(np.int16)
    return out


def generated_page(index: int, seed: int, reading_frac: float, degrade_prob: float,
                   levels: tuple[float, float] = (1.0, 1.0)) -> Page:
    """Page `index` of the generator stream `seed`: a random-line reading page with probability
    `reading_frac` (drawn on the canvas itself, its level drawn uniformly from `levels`), else a business
    document from quantize/docgen, letterboxed."""
    rng = np.random.default_rng([seed, index, 3])
    if reading_frac and rng.random() < reading_frac:
        lo, hi = levels
        canvas, rec = reading_page(index, seed, lo if hi <= lo else float(rng.uniform(lo, hi)))
        return Page(canvas, rec["text"], tuple((ln["text"], tuple(ln["box"])) for ln in rec["lines"]))
    from quantize.docgen import GenOptions, make_document
    img, rec = make_document(index, seed, GenOptions(degrade_prob=degrade_prob))
    canvas, lb = letterbox(img)
    return Page(canvas, rec["text"], _lines_on_canvas(rec["lines"], lb))


def labelled_page(path: Path, rec: dict) -> Page:
    """An image with its calibration_data-format label record ("lines": [{"text", "box" in the image's
    pixels}], optional "text"; without it the lines joined in order)."""
    canvas, lb = letterbox(load_image(path))
    lines = rec.get("lines") or []
    text = rec.get("text")
    if text is None:
        text = "\n".join(ln["text"] for ln in lines)
    return Page(canvas, text, _lines_on_canvas(lines, lb))


def labelled_records(folder: Path) -> list[tuple[Path, dict]]:
    """(image path, label record) of every labelled image of a folder in the calibration_data format
    (images + labels.jsonl with "image" and "lines")."""
    path = Path(folder) / "labels.jsonl"
    if not path.exists():
        raise ValueError(f"--pages {folder}: no labels.jsonl (images + labels.jsonl with image and lines)")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        rec = json.loads(line)
        if "image" not in rec or not isinstance(rec.get("lines", []), list):
            raise ValueError(f"{path}:{n}: a record needs 'image' and a list of 'lines'")
        out.append((Path(folder) / rec["image"], rec))
    return out


def _lines_on_canvas(lines: list[dict], lb) -> tuple:
    return tuple((ln["text"], tuple(lb.left + v * lb.scale if i % 2 == 0 else lb.top + v * lb.scale
                                    for i, v in enumerate(ln["box"]))) for ln in lines)


def reading_page(index: int, seed: int, level: float = 1.0) -> tuple[np.ndarray, dict]:
    """A canvas of random lines (digits, Latin, the generator's CJK characters) in random fonts and sizes.

    No language prior can predict these lines, so they teach the encoder to read; the business documents
    then teach layout and reading order.  `level` in [0, 1] is the curriculum: at 0 a few short lines in
    large type (36-96 px), at 1 up to 600 characters at 12-44 px.  Returns (canvas uint8 [S, S, 3],
    record with text and line boxes).
    """
    from PIL import Image, ImageDraw

    from quantize.docgen.fonts import discover, generator_charset, truetype

    rng = np.random.default_rng([seed, index, 17])
    cjk_chars = [c for c in generator_charset() if ord(c) > 0x2E80]
    latin = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    punct = ".,:;-/#()%&*+@"
    fs = discover()
    bg = int(rng.integers(225, 256))
    img = Image.new("RGB", (CANVAS, CANVAS), (bg, bg, max(0, bg - int(rng.integers(0, 12)))))
    draw = ImageDraw.Draw(img)
    lv = min(1.0, max(0.0, level))
    lo, hi = 36 + (12 - 36) * lv, 96 + (44 - 96) * lv                    # type size range, px
    size = int(np.exp(rng.uniform(np.log(lo), np.log(hi))))
    budget = int(rng.integers(int(20 + 100 * lv), int(120 + 480 * lv)))   # characters on the page
    y, lines = int(rng.integers(8, 40)), []
    while sum(len(ln["text"]) for ln in lines) < budget:
        size_l = max(10, int(size * rng.uniform(0.85, 1.2)))
        if y + size_l * 1.4 > CANVAS - 8:
            break
        mix = rng.random()
        face = fs.pick(rng, cjk=mix < 0.5, bold=rng.random() < 0.2)
        font = truetype(face, size_l)
        x0 = int(rng.integers(8, 120))
        words = []
        limit = rng.uniform(0.3, 1.0) * (CANVAS - x0 - 8)
        while True:
            kind = rng.random()
            if mix < 0.5 and kind < 0.55:
                w = "".join(rng.choice(cjk_chars, int(rng.integers(1, 7))))
            elif kind < 0.8:
                w = "".join(rng.choice(list("0123456789"), int(rng.integers(1, 12))))
                if rng.random() < 0.3:
                    w = w[:-2] + "." + w[-2:] if len(w) > 2 else w
            else:
                w = "".join(rng.choice(list(latin), int(rng.integers(1, 9))))
            if rng.random() < 0.15:
                w += str(rng.choice(list(punct)))
            cand = (" ".join(words + [w])) if words else w
            tw = draw.textlength(cand, font=font)
            if tw > limit:
                break
            words.append(w)
        if words:
            text = " ".join(words)
            ink = int(rng.integers(0, 90))
            draw.text((x0, y), text, font=font, fill=(ink, ink, ink + int(rng.integers(0, 40))))
            l, t, r, b = draw.textbbox((x0, y), text, font=font)
            lines.append({"text": text, "box": [l, t, r, b]})
        y += int(size_l * rng.uniform(1.3, 2.2))
    canvas = np.asarray(img, dtype=np.uint8).copy()
    return canvas, {"text": "\n".join(ln["text"] for ln in lines), "lines": lines}
