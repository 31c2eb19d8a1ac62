"""Output post-processing: spotting parse with box mapping, repeated-substring cleanup (spec §7.3)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from edgeocr.preprocess import Letterbox

_BOX = re.compile(r"\((\d+),\s*(\d+)\),\s*\((\d+),\s*(\d+)\)")
NORM = 1000   # spotting coordinates are normalized to [0, 1000] of the model's input canvas


@dataclass(frozen=True)
class TextLine:
    text: str
    box: tuple[int, int, int, int]        # x1, y1, x2, y2 in original-image pixels
    box_norm: tuple[int, int, int, int]   # as the model wrote it, 0..1000 of the canvas


def _to_pixels(b: tuple[int, int, int, int], lb: Letterbox, canvas: int) -> tuple[int, int, int, int]:
    k = canvas / NORM
    x1, y1 = lb.to_original(b[0] * k, b[1] * k)
    x2, y2 = lb.to_original(b[2] * k, b[3] * k)
    return (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))


def parse_spotting(text: str, lb: Letterbox, canvas: int) -> list[TextLine]:
    """`text(x1,y1),(x2,y2)` items (hunyuan format), or the 1.5 JSON form
    `[{"box": [x1, y1, x2, y2], "text": ...}]`.  Text between two boxes belongs to the second."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            items = json.loads(stripped)
            lines = []
            for it in items:
                b = tuple(int(v) for v in it["box"])
                if len(b) == 4:
                    lines.append(TextLine(str(it.get("text", "")), _to_pixels(b, lb, canvas), b))
            return lines
        except (ValueError, KeyError, TypeError):
            pass   # fall through to the regex form
    lines, prev = [], 0
    for m in _BOX.finditer(text):
        t = text[prev:m.start()].strip()
        b = tuple(int(g) for g in m.groups())
        lines.append(TextLine(t, _to_pixels(b, lb, canvas), b))
        prev = m.end()
    return lines


def clean_repeated_substrings(text: str, min_len: int = 2000, min_repeats: int = 10) -> str:
    """1.5's cleanup: if a text of >= min_len chars ends in a unit (>= 2 chars) repeated >= min_repeats
    times back to back, keep one copy of it."""
    n = len(text)
    if n < min_len:
        return text
    for u in range(2, n // min_repeats + 1):
        unit = text[n - u:]
        count = 1
        while text.endswith(unit * (count + 1)):
            count += 1
        if count >= min_repeats:
            return text[: n - u * count] + unit
    return text
