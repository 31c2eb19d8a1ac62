"""Are a model's errors misread glyphs or lost places?  From a `scripts/peer_compare.py` JSON (each page's output
per system) and the set's labels, word by word (whitespace-separated cells of the output and of the label lines):

    precision       share of the output's cells that occur on the page (a misread or invented cell does not)
    recall          share of the page's distinct cells that the output has
    repeated        share of the output's cells that it already wrote once
    in order        share of consecutive found cells whose place on the page moves forward by 1-8 cells
                    (reading on), where a jump back or far ahead is a lost place
    first miss      the median index of the first output cell that is not on the page

    python scripts/diag_reading_order.py docs/peer_compare_html.json --data calibration_data/eval_html \
        [--systems fp32 int8] [--json OUT]

A system that writes a line's cells without spaces (RapidOCR joins them) scores low on cells whatever it reads; the
figures compare a system with itself across sets or checkpoints.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def cells_of(text: str) -> list[str]:
    return [c for line in text.split("\n") for c in line.split() if c]


def page_stats(out_text: str, label: dict) -> dict:
    cells = cells_of(out_text)
    lab = [c for line in label.get("lines", []) for c in line["text"].split() if c]
    where: dict[str, list[int]] = {}
    for i, c in enumerate(lab):
        where.setdefault(c, []).append(i)
    found, seen, repeated, pos, used = 0, set(), 0, [], {}
    for c in cells:
        repeated += c in seen
        seen.add(c)
        if c in where:
            found += 1
            k = used.get(c, 0)
            pos.append(where[c][min(k, len(where[c]) - 1)])
            used[c] = k + 1
    steps = [b - a for a, b in zip(pos, pos[1:])]
    return {"cells": len(cells), "label_cells": len(lab),
            "precision": found / max(1, len(cells)),
            "recall": len({c for c in cells if c in where}) / max(1, len(where)),
            "repeated": repeated / max(1, len(cells)),
            "in_order": sum(1 for s in steps if 0 < s <= 8) / max(1, len(steps)),
            "first_miss": next((i for i, c in enumerate(cells) if c not in where), len(cells))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="a scripts/peer_compare.py JSON")
    ap.add_argument("--data", type=Path, required=True, help="the page folder it was run on (labels.jsonl)")
    ap.add_argument("--systems", nargs="+", help="systems to score (default: every system in the JSON)")
    ap.add_argument("--json", type=Path, help="write the per-system means here")
    args = ap.parse_args(argv)
    res = json.loads(args.results.read_text())
    labels = {}
    for line in (args.data / "labels.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            labels[r["image"]] = r
    systems = args.systems or list(res["systems"])
    out = {}
    for system in systems:
        rows = []
        for p in res["pages"]:
            got = p["systems"].get(system)
            if got is None or p["image"] not in labels:
                continue
            rows.append({**page_stats(got["text"], labels[p["image"]]), "cer_nows": got.get("cer_nows")})
        if not rows:
            print(f"{system}: no pages", file=sys.stderr)
            continue
        mean = {k: float(np.mean([r[k] for r in rows if r[k] is not None])) for k in rows[0] if k != "first_miss"}
        mean["first_miss_median"] = float(np.median([r["first_miss"] for r in rows]))
        mean["pages"] = len(rows)
        out[system] = mean
        print(f"{system:10s} {len(rows)} pages  CER {mean['cer_nows']:.3f}  cells {mean['cells']:.0f} "
              f"(label {mean['label_cells']:.0f})  precision {mean['precision']:.3f}  recall {mean['recall']:.3f}  "
              f"repeated {mean['repeated']:.3f}  in order {mean['in_order']:.3f}  "
              f"first miss {mean['first_miss_median']:.0f}")
    if args.json:
        args.json.write_text(json.dumps({"results": str(args.results), "data": str(args.data), "systems": out},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
