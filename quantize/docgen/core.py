"""Page canvas that records every text line it draws, degradations that move the boxes with the
pixels, and the label record in HunyuanOCR's own output formats."""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw

from quantize.docgen.fonts import FontFace, FontSet, truetype

INK = (20, 20, 25)


@dataclass
class Line:
    text: str
    box: tuple[int, int, int, int]     # x1, y1, x2, y2 pixels (ink bounds)


@dataclass
class Page:
    """A white (or tinted) page; `text` draws and records a line with its ink bounding box."""

    width: int
    height: int
    fonts: FontSet
    rng: np.random.Generator
    bg: tuple[int, int, int] = (255, 255, 255)
    lines: list[Line] = field(default_factory=list)
    fields: dict = field(default_factory=dict)

    def __post_init__(self):
        self.img = Image.new("RGB", (self.width, self.height), self.bg)
        self.draw = ImageDraw.Draw(self.img)

    def text(self, xy, s: str, face: FontFace, size: int, fill=INK, anchor: str = "la",
             record: bool = True) -> tuple[int, int, int, int]:
        """Draw `s` at xy (anchor as in Pillow); returns and records its ink box, clipped to the page."""
        s = s.strip()
        if not s:
            return (xy[0], xy[1], xy[0], xy[1])
        font = truetype(face, int(size))
        self.draw.text(xy, s, font=font, fill=fill, anchor=anchor)
        # exact ink bounds: the glyph mask's bbox (textbbox includes side bearings of e.g. full-width "（")
        start = (math.modf(xy[0])[0], math.modf(xy[1])[0])      # as ImageDraw.text positions it
        mask, (ox, oy) = font.getmask2(s, "L", anchor=anchor, start=start)
        ib = Image.frombytes("L", mask.size, bytes(mask)).getbbox() if mask.size[0] and mask.size[1] else None
        if ib is None:
            return (xy[0], xy[1], xy[0], xy[1])
        x0, y0 = int(xy[0]) + ox, int(xy[1]) + oy
        box = (max(0, x0 + ib[0]), max(0, y0 + ib[1]), min(self.width, x0 + ib[2]), min(self.height, y0 + ib[3]))
        if record and box[2] > box[0] and box[3] > box[1]:
            self.lines.append(Line(s, box))
        return box

    def text_width(self, s: str, face: FontFace, size: int) -> int:
        return int(self.draw.textlength(s, font=truetype(face, int(size))))

    def fit(self, s: str, face: FontFace, size: int, max_w: int, min_size: int = 10) -> int:
        """Largest size <= `size` at which `s` fits in max_w pixels."""
        while size > min_size and self.text_width(s, face, size) > max_w:
            size -= 1
        return size

    def rect(self, box, outline=INK, width: int = 1, fill=None) -> None:
        self.draw.rectangle(box, outline=outline, width=width, fill=fill)

    def hline(self, x1, x2, y, fill=INK, width: int = 1) -> None:
        self.draw.line([(x1, y), (x2, y)], fill=fill, width=width)

    def vline(self, x, y1, y2, fill=INK, width: int = 1) -> None:
        self.draw.line([(x, y1), (x, y2)], fill=fill, width=width)


# ---------------------------------------------------------------------------- degradations
def _stamp(img: Image.Image, rng, cx: int, cy: int, r: int) -> None:
    """Red seal (ring + star), alpha-blended over the text; it carries no label text."""
    over = Image.new("RGBA", img.size, (0, 0, 0, 0))
    d = ImageDraw.Draw(over)
    col = (200, 30, 40, int(rng.integers(110, 190)))
    w = max(3, r // 12)
    d.ellipse((cx - r, cy - r, cx + r, cy + r), outline=col, width=w)
    d.ellipse((cx - r + 2 * w, cy - r + 2 * w, cx + r - 2 * w, cy + r - 2 * w), outline=col, width=max(1, w // 3))
    pts = []
    for k in range(10):
        ang = -np.pi / 2 + k * np.pi / 5
        rr = r * (0.32 if k % 2 == 0 else 0.13)
        pts.append((cx + rr * np.cos(ang), cy + rr * np.sin(ang)))
    d.polygon(pts, fill=col)
    img.paste(Image.alpha_composite(img.convert("RGBA"), over).convert("RGB"))


def degrade(img: Image.Image, lines: list[Line], rng, strength: float = 1.0) -> tuple[Image.Image, list[Line], list[str]]:
    """Scan / phone-photo effects.  Geometric ones transform every box (axis-aligned hull of the
    moved corners, clipped to the image).  Returns the new image, lines and the effects applied."""
    import cv2

    applied: list[str] = []
    w, h = img.size
    if rng.random() < 0.35 * strength:
        for _ in range(int(rng.integers(1, 3))):
            _stamp(img, rng, int(rng.integers(w // 5, 4 * w // 5)), int(rng.integers(h // 5, 4 * h // 5)),
                   int(rng.integers(min(w, h) // 14, min(w, h) // 8)))
        applied.append("stamp")
    a = np.asarray(img)
    gain = None                              # multiplicative light map, computed on a coarse grid
    gh, gw = 64, max(8, int(64 * w / h))
    yy, xx = np.meshgrid(np.linspace(-1, 1, gh, dtype=np.float32), np.linspace(-1, 1, gw, dtype=np.float32),
                         indexing="ij")
    if rng.random() < 0.5 * strength:        # uneven lighting: a smooth gradient with a vignette
        gx, gy = rng.uniform(-0.25, 0.25, 2)
        gain = 1.0 + gx * xx + gy * yy - 0.15 * rng.random() * (xx ** 2 + yy ** 2)
        applied.append("lighting")
    if gain is not None:
        g = cv2.resize(gain.astype(np.float32), (w, h), interpolation=cv2.INTER_LINEAR)
        a = cv2.multiply(a, cv2.merge([g, g, g]), dtype=cv2.CV_8U)
    if rng.random() < 0.25 * strength:       # fold: a soft dark crease with a lighter side, full resolution rows
        y = rng.uniform(0.2, 0.8) * h
        rows = np.arange(h, dtype=np.float32)
        crease = 1.0 - 0.18 * np.exp(-((rows - y) / 3.0) ** 2) + 0.05 * np.tanh((rows - y) / 40.0)
        a = cv2.multiply(a, np.repeat(crease[:, None, None], 3, axis=2).repeat(w, axis=1), dtype=cv2.CV_8U)
        applied.append("fold")
    M = None
    if rng.random() < 0.5 * strength:        # slight rotation + perspective
        src = np.float32([[0, 0], [w, 0], [w, h], [0, h]])
        jit = rng.uniform(-0.012, 0.012, (4, 2)) * np.float32([w, h]) * strength
        ang = np.deg2rad(rng.uniform(-1.5, 1.5) * strength)
        c, s = np.cos(ang), np.sin(ang)
        ctr = np.float32([w / 2, h / 2])
        dst = (src - ctr) @ np.float32([[c, s], [-s, c]]) + ctr + jit
        M = cv2.getPerspectiveTransform(src, dst.astype(np.float32))
        a = cv2.warpPerspective(a, M, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
                                borderValue=(235, 235, 232))
        applied.append("perspective")
    if rng.random() < 0.4 * strength:
        k = int(rng.choice([3, 5]))
        a = cv2.GaussianBlur(a, (k, k), rng.uniform(0.4, 1.0))
        applied.append("blur")
    if rng.random() < 0.5 * strength:
        noise = (rng.standard_normal((h, w), dtype=np.float32) * rng.uniform(3, 9)).astype(np.int16)
        a = np.clip(a.astype(np.int16) + noise[..., None], 0, 255).astype(np.uint8)
        applied.append("noise")
    out = Image.fromarray(a)
    if rng.random() < 0.5 * strength:
        b = io.BytesIO()
        out.save(b, "JPEG", quality=int(rng.integers(35, 75)))
        out = Image.open(io.BytesIO(b.getvalue())).convert("RGB")
        applied.append("jpeg")
    if M is not None:
        moved = []
        for ln in lines:
            x1, y1, x2, y2 = ln.box
            pts = cv2.perspectiveTransform(np.float32([[[x1, y1], [x2, y1], [x2, y2], [x1, y2]]]), M)[0]
            bx = (max(0, int(np.floor(pts[:, 0].min()))), max(0, int(np.floor(pts[:, 1].min()))),
                  min(w, int(np.ceil(pts[:, 0].max()))), min(h, int(np.ceil(pts[:, 1].max()))))
            if bx[2] > bx[0] and bx[3] > bx[1]:
                moved.append(Line(ln.text, bx))
        lines = moved
    return out, lines, applied


# ---------------------------------------------------------------------------- labels
def norm_box(box, w: int, h: int) -> list[int]:
    """Pixels -> 0..1000 of the image, as HunyuanOCR writes coordinates."""
    x1, y1, x2, y2 = box
    return [int(x1 * 1000 / w), int(y1 * 1000 / h), int(x2 * 1000 / w), int(y2 * 1000 / h)]


def label_record(doc_id: str, image_name: str, kind: str, lang: str, w: int, h: int, lines: list[Line],
                 fields: dict, degradations: list[str], seed: int) -> dict:
    items = [{"text": ln.text, "box": list(ln.box), "box_norm": norm_box(ln.box, w, h)} for ln in lines]
    full = "\n".join(ln.text for ln in lines)
    spotting = "".join(f"{it['text']}({it['box_norm'][0]},{it['box_norm'][1]}),({it['box_norm'][2]},{it['box_norm'][3]})"
                       for it in items)
    spotting_json = json.dumps([{"box": it["box_norm"], "text": it["text"]} for it in items], ensure_ascii=False)
    return {
        "id": doc_id, "image": image_name, "kind": kind, "lang": lang, "width": w, "height": h, "seed": seed,
        "degradations": degradations, "lines": items, "text": full, "fields": fields,
        "targets": {"spotting": spotting, "spotting_json": spotting_json, "structured_parse": full,
                    "fields_json": json.dumps(fields, ensure_ascii=False)},
    }
