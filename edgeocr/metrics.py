"""OCR metrics: edit distance, CER, NED, field accuracy (pure functions)."""

from __future__ import annotations

import json
import re


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
