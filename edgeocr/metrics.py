"""OCR metrics: edit distance, CER, NED, field accuracy (pure functions)."""

from __future__ import annotations

import json
import re
import unicodedata


def levenshtein(a: str, b: str) -> int:
    try:
        from rapidfuzz.distance import Levenshtein
        return int(Levenshtein.distance(a, b))
    except ImportError:
        pass
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def cer(hyp: str, ref: str) -> float:
    """Character error rate: edits / reference length (1.0 for a non-empty hypothesis of an empty reference)."""
    if not ref:
        return 0.0 if not hyp else 1.0
    return levenshtein(hyp, ref) / len(ref)


def strip_whitespace(text: str) -> str:
    """`text` without any whitespace character (str.isspace: spaces, tabs, line breaks, U+3000 ...)."""
    return "".join(text.split())


def cer_nows(hyp: str, ref: str) -> float:
    """CER with all whitespace removed from both strings first: line breaks, spaces and indentation do not
    count, so a reading that splits or joins lines differently from the label is not penalized for it.
    The denominator is the label's length without whitespace."""
    return cer(strip_whitespace(hyp), strip_whitespace(ref))


def cer_nows_nfkc(hyp: str, ref: str) -> float:
    """`cer_nows` after Unicode NFKC normalization of both strings: full-width and half-width forms
    (Ａ / A, １ / 1, ： / :, （ / ( ...) and compatibility characters count as the same character."""
    return cer_nows(unicodedata.normalize("NFKC", hyp), unicodedata.normalize("NFKC", ref))


def ned(hyp: str, ref: str) -> float:
    """Normalized edit distance in [0, 1]: edits / max length."""
    n = max(len(hyp), len(ref))
    return 0.0 if n == 0 else levenshtein(hyp, ref) / n


def _norm(v) -> str:
    return re.sub(r"\s+", "", str(v)).strip()


def parse_json_object(text: str) -> dict | None:
    """The first JSON object in `text` (models often wrap it in prose or ``` fences)."""
    start = text.find("{")
    while start != -1:
        depth = 0
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    try:
                        obj = json.loads(text[start:i + 1])
                        return obj if isinstance(obj, dict) else None
                    except json.JSONDecodeError:
                        break
        start = text.find("{", start + 1)
    return None


def field_accuracy(hyp_text: str, fields: dict) -> float:
    """Share of expected fields whose value the output gives exactly (whitespace ignored)."""
    if not fields:
        return 1.0
    got = parse_json_object(hyp_text) or {}
    return sum(_norm(got.get(k, "")) == _norm(v) for k, v in fields.items()) / len(fields)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, or None when the sequences are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def box_iou(a, b) -> float:
    """Intersection over union of two [x1, y1, x2, y2] boxes."""
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def spotting_scores(pred: list, gold: list, thresh: float = 0.5) -> dict:
    """Boxes of predicted vs labelled lines, matched one to one by highest IoU first.

    `pred` and `gold` are [x1, y1, x2, y2] lists in the same pixel frame.  Returns mean_iou (over the
    labelled lines, unmatched ones count 0) and precision / recall / f1 of matches with IoU >= thresh.
    """
    if not gold:
        return {"mean_iou": None, "precision": None, "recall": None, "f1": None}
    pairs = sorted(((box_iou(p, g), i, j) for i, p in enumerate(pred) for j, g in enumerate(gold)), reverse=True)
    used_p, used_g, ious = set(), set(), {}
    for iou, i, j in pairs:
        if iou <= 0:
            break
        if i in used_p or j in used_g:
            continue
        used_p.add(i)
        used_g.add(j)
        ious[j] = iou
    hits = sum(1 for v in ious.values() if v >= thresh)
    prec = hits / len(pred) if pred else 0.0
    rec = hits / len(gold)
    return {"mean_iou": sum(ious.values()) / len(gold), "precision": prec, "recall": rec,
            "f1": 2 * prec * rec / (prec + rec) if prec + rec else 0.0}
