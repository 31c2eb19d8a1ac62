"""`--out FILE.parquet` for `edgeocr run --ray`: the rows of the JSONL file, as one Parquet table.

    state = prepare("pages.parquet", resume=True)     # what the file (and an interrupted run's journal) holds
    with ParquetOut("pages.parquet") as out:
        out.write(record)                     # a JSONL line's dict: {file, page, text, ...} or {file, page, error}
    read_records("pages.parquet")                     # the same dicts back

A Parquet file is written whole, so rows are appended to a journal beside it, `FILE.parquet.partial.jsonl`
(edgeocr.batchrun's JSONL writer: one flushed line per page), and `close` writes the table: the rows the
file already held, then the journal's, into a temporary file renamed over FILE.parquet.  A run killed
before `close` leaves the journal; `--resume` takes its pages as done and the next `close` folds them in.
pyarrow comes with the `ray` extra; it is imported here only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from edgeocr import batchrun

JOURNAL_SUFFIX = ".partial.jsonl"    # FILE.parquet -> FILE.parquet.partial.jsonl
ROW_GROUP = 4096                     # rows per Parquet row group


def journal_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + JOURNAL_SUFFIX)


def schema():
    """The JSONL line as Arrow types.  timings_ms is a map (its keys vary by path: blank pages have fewer)."""
    import pyarrow as pa

    box = pa.list_(pa.int64())
    return pa.schema([
        ("file", pa.string()), ("page", pa.int64()),                  # page: 1-based PDF page; null for an image
        ("text", pa.string()), ("finish_reason", pa.string()), ("task", pa.string()),
        ("lines", pa.list_(pa.struct([("text", pa.string()), ("box", box), ("box_norm", box)]))),
        ("prompt_tokens", pa.int64()), ("generated_tokens", pa.int64()),
        ("image_size", pa.list_(pa.int64())),                         # original (width, height)
        ("timings_ms", pa.map_(pa.string(), pa.float64())),
        ("error", pa.struct([("type", pa.string()), ("message", pa.string())])),   # null for a recognized page
    ])


def to_table(records: list[dict]):
    """Records (JSONL dicts) as a table of `schema()`; a key the schema lacks is an error, not dropped."""
    import pyarrow as pa

    sch = schema()
    for rec in records:
        extra = set(rec) - set(sch.names)
        if extra:
            raise batchrun.OutputError(f"a row has fields the Parquet schema lacks: {', '.join(sorted(extra))}")
    return pa.Table.from_pylist(records, schema=sch)


def from_table(table) -> list[dict]:
    """Rows back as the JSONL line's dicts: an error row as {file, page, error}; timings_ms as a dict."""
    out = []
    for row in table.to_pylist():
        if row["error"] is not None:
            out.append({"file": row["file"], "page": row["page"], "error": row["error"]})
            continue
        row.pop("error")
        row["timings_ms"] = dict(row["timings_ms"] or [])
        out.append(row)
    return out


def read_records(path: str | Path) -> list[dict]:
    import pyarrow.parquet as pq

    return from_table(pq.read_table(path))


def _read(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path, schema=schema())
    except (pa.ArrowInvalid, OSError) as e:
        raise batchrun.OutputError(f"--out {path} is not a Parquet file written by `edgeocr run --ray` ({e}); "
                                   f"not resuming over it (use --overwrite to start over)") from None


def prepare(path: str | Path, resume: bool = False, overwrite: bool = False) -> batchrun.ResumeState:
    """As batchrun.prepare_output for a Parquet file and its journal: error rows are dropped (their pages
    run again), recognized rows kept; an existing file needs `resume` or `overwrite`."""
    import pyarrow.compute as pc

    path, journal = Path(path), journal_path(path)
    if path.is_dir():
        raise batchrun.OutputError(f"--out {path}: is a directory")
    if not path.parent.is_dir():
        raise batchrun.OutputError(f"--out {path}: folder {path.parent} does not exist")
    present = [p for p in (path, journal) if p.exists() and p.stat().st_size > 0]
    if present and overwrite:
        for p in present:
            p.unlink()
        present = []
    if not present:
        return batchrun.ResumeState(frozenset(), 0, 0, 0)
    if not resume:
        what = " (with the journal of an interrupted run)" if journal in present else ""
        raise batchrun.OutputError(f"--out {path} already exists{what}: pass --resume to continue it or --overwrite "
                                   f"to start over")
    done, failed, kept, retried = set(), set(), 0, 0
    if path in present:
        table = _read(path)
        ok = pc.is_null(table.column("error"))
        keys = list(zip(table.column("file").to_pylist(), table.column("page").to_pylist()))
        for key, good in zip(keys, ok.to_pylist()):
            (done if good else failed).add(key)
        kept = int(pc.sum(ok).as_py() or 0)
        retried = table.num_rows - kept
    j = batchrun.prepare_output(journal, resume=True) if journal in present else \
        batchrun.ResumeState(frozenset(), 0, 0, 0)
    return batchrun.ResumeState(frozenset(done | j.done), kept + j.kept, retried + j.retried, j.partial_bytes,
                                frozenset((failed | j.failed) - done - j.done))


class ParquetOut:
    """write(record) appends to the journal (flushed per page); close() writes FILE.parquet: its recognized
    rows, then the journal's, and removes the journal.  Call after `prepare`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.journal = batchrun.JsonlWriter(journal_path(self.path))
        self.lines = 0

    def write(self, record: dict) -> None:
        self.journal.write(record)
        self.lines = self.journal.lines

    def close(self) -> None:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        self.journal.close()
        jpath = self.journal.path
        if not jpath.exists():
            return                                   # closed before
        old = _read(self.path) if self.path.exists() and self.path.stat().st_size > 0 else None
        tmp = self.path.with_name(self.path.name + ".tmp")
        with pq.ParquetWriter(tmp, schema()) as w:
            if old is not None:
                w.write_table(old.filter(pc.is_null(old.column("error"))), row_group_size=ROW_GROUP)
            batch = []
            with open(jpath, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        batch.append(json.loads(line))
                    if len(batch) == ROW_GROUP:
                        w.write_table(to_table(batch))
                        batch = []
            if batch:
                w.write_table(to_table(batch))
        os.replace(tmp, self.path)
        jpath.unlink()

    def __enter__(self) -> ParquetOut:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
