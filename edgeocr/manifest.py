"""manifest.json: the one description of an artifact directory (graphs, I/O, cache, tokens, rope).

Code never parses meaning out of file names: everything the runtime needs is stated here.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from edgeocr.errors import ArtifactError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
FORMAT_NAME = "edgeocr-artifact"


@dataclass(frozen=True)
class Manifest:
    format_version: int          # FORMAT_VERSION this artifact was written with
    source: dict                 # {"checkpoint": path, "sha256": hash of config/tokenizer/weights}
    precision: str               # "fp32" | "fp16" | "int8"
    model: dict                  # quantize.checkpoint.ModelSpec as a dict
    graphs: dict                 # name -> {"file", "inputs", "outputs", ...}
    kv_cache: dict               # layers, kv_heads, head_dim, max_len, layout, dtype, bytes_per_token
    rope: dict                   # layout ("A"/"B"), theta, alpha, sections, head_dim
    preprocess: dict             # canvas, patch_size, merge_size, n_image_tokens, mean, std, pad_value
    tokens: dict                 # bos, eos, eod, image, im_start, im_end, user, system_sep, stop_ids
    decode: dict                 # defaults: repetition_penalty
    tokenizer: str               # file name of tokenizer.json
    files: dict                  # file name -> {"bytes", "sha256"}
    export: dict = field(default_factory=dict)    # opset, ir_version, seconds, tool versions
    engines: dict = field(default_factory=dict)   # TensorRT engines built on the device, if any
    format: str = FORMAT_NAME

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, ensure_ascii=False)


def io_dtype(m: Manifest, graph: str, name: str) -> str:
    """dtype of graph `graph`'s input or output `name` as recorded at export ("float32" when absent)."""
    g = m.graphs[graph]
    return next((e["dtype"] for e in g.get("inputs", []) + g.get("outputs", []) if e["name"] == name), "float32")


def write_manifest(directory: Path, m: Manifest) -> None:
    """Atomic write: a reader never sees half a manifest."""
    directory = Path(directory)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".manifest.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(m.to_json())
    os.chmod(tmp, 0o644)
    os.replace(tmp, directory / MANIFEST)


REQUIRED = ("format_version", "precision", "model", "graphs", "kv_cache", "rope", "preprocess",
            "tokens", "decode", "tokenizer", "files")


def read_manifest(directory: Path) -> Manifest:
    directory = Path(directory)
    if not directory.exists():
        raise ArtifactError(f"{directory}: no such artifact directory")
    if not directory.is_dir():
        raise ArtifactError(f"{directory}: not a directory (pass the artifact directory, not a file in it)")
    path = directory / MANIFEST
    if not path.exists():
        raise ArtifactError(f"{directory}: no {MANIFEST}; not an edgeocr artifact "
                            "(create one with `python -m quantize export CHECKPOINT OUT`)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        raise ArtifactError(f"{path}: not an edgeocr manifest (format={raw.get('format') if isinstance(raw, dict) else None!r})")
    ver = raw.get("format_version")
    if ver != FORMAT_VERSION:
        raise ArtifactError(f"{path}: format_version {ver!r}, but this edgeocr reads version {FORMAT_VERSION}; "
                            "re-export the artifact with this edgeocr version")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise ArtifactError(f"{path}: missing field(s) {missing}")
    known = set(Manifest.__dataclass_fields__)
    m = Manifest(**{k: v for k, v in raw.items() if k in known})
    for name, info in m.files.items():
        p = directory / name
        if not p.exists():
            raise ArtifactError(f"{directory}: manifest lists {name}, which is missing")
        if p.stat().st_size != info.get("bytes"):
            raise ArtifactError(f"{p}: size {p.stat().st_size} differs from the manifest's {info.get('bytes')}; "
                                "the artifact is incomplete or was modified")
    return m
