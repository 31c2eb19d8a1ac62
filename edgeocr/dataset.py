"""Image directories with optional ground truth, as calibration and the accuracy checker read them.

A directory holds images (.png .jpg .jpeg .bmp .webp .tif .tiff) and optionally one label file:
- labels.jsonl: one JSON object per line with at least "image" (file name relative to the
  directory); optional "text" (reading-order full text; when absent, the lines' texts joined by
  newlines), "lines" ([{"text", "box": [x1,y1,x2,y2]}]),
  "fields" ({key: value}), "kind", "lang", "targets" — the schema calibration_data/ uses;
- labels.csv: header with "image" and "text" columns, optional "fields" (a JSON object).
A bad label file is an error that names the file, line and problem; images without a label are
kept (label None), never dropped silently.
"""

from __future__ import annotations

import csv
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from edgeocr.errors import EdgeOCRError

log = logging.getLogger("edgeocr")

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff"}


class DatasetError(EdgeOCRError, ValueError):
    """The data directory or its label file is unusable."""


@dataclass(frozen=True)
class Sample:
    path: Path              # image file
    label: dict | None      # the label record, or None when the image has no label

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def text(self) -> str | None:
        """The reference full text: the label's "text", else its lines' texts joined by newlines."""
        if self.label is None:
            return None
        if "text" in self.label:
            return self.label["text"]
        lines = self.label.get("lines")
        if lines and all(isinstance(ln.get("text"), str) for ln in lines):
            return "\n".join(ln["text"] for ln in lines)
        return None

    @property
    def fields(self) -> dict | None:
        return None if self.label is None else self.label.get("fields")


def _jsonl(path: Path) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise DatasetError(f"{path}:{n}: expected a JSON object, got {type(rec).__name__}")
            _check(rec, f"{path}:{n}")
            out.append(rec)
    return out


def _csv(path: Path) -> list[dict]:
    out = []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or "image" not in reader.fieldnames:
            raise DatasetError(f"{path}: header must have an 'image' column (has {reader.fieldnames})")
        for n, row in enumerate(reader, 2):
            rec: dict = {"image": row["image"]}
            if row.get("text") is not None:
                rec["text"] = row["text"]
            if row.get("fields"):
                try:
                    rec["fields"] = json.loads(row["fields"])
                except json.JSONDecodeError as e:
                    raise DatasetError(f"{path}:{n}: 'fields' is not valid JSON ({e.msg})") from None
            _check(rec, f"{path}:{n}")
            out.append(rec)
    return out


def _check(rec: dict, where: str) -> None:
    img = rec.get("image")
    if not isinstance(img, str) or not img:
        raise DatasetError(f"{where}: missing 'image' (the image file name)")
    if "text" in rec and not isinstance(rec["text"], str):
        raise DatasetError(f"{where}: 'text' must be a string")
    if "fields" in rec and not isinstance(rec["fields"], dict):
        raise DatasetError(f"{where}: 'fields' must be an object")
    for i, ln in enumerate(rec.get("lines") or []):
        box = ln.get("box") if isinstance(ln, dict) else None
        if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)):
            raise DatasetError(f"{where}: lines[{i}].box must be [x1, y1, x2, y2]")


def load_dir(directory: str | Path) -> list[Sample]:
    """All images of `directory`, sorted by name, each with its label (or None)."""
    d = Path(directory)
    if not d.is_dir():
        raise DatasetError(f"{d}: not a directory")
    images = sorted(p for p in d.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    jl, cs = d / "labels.jsonl", d / "labels.csv"
    if jl.exists() and cs.exists():
        raise DatasetError(f"{d}: both labels.jsonl and labels.csv exist; keep one")
    labels: dict[str, dict] = {}
    src = jl if jl.exists() else cs if cs.exists() else None
    if src is not None:
        try:
            records = _jsonl(src) if src == jl else _csv(src)
        except UnicodeDecodeError:
            raise DatasetError(f"{src}: not UTF-8 text") from None
        for rec in records:
            if rec["image"] in labels:
                raise DatasetError(f"{src}: image {rec['image']!r} is labelled twice")
            labels[rec["image"]] = rec
        names = {p.name for p in images}
        missing = [n for n in labels if n not in names]
        if missing:
            more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
            raise DatasetError(f"{src}: labels name image(s) not in {d}: {missing[:3]}{more}")
    if not images:
        raise DatasetError(f"{d}: no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    samples = [Sample(p, labels.get(p.name)) for p in images]
    unlabeled = sum(s.label is None for s in samples)
    if src is not None and unlabeled:
        log.warning("%s: %d of %d images have no label in %s", d, unlabeled, len(samples), src.name)
    return samples

