"""The artifact description: one typed, versioned view of `manifest.json`, read once.

An artifact directory holds the vision and decoder graphs, the tokenizer and `manifest.json`, which states
everything the runtime needs (graph files and I/O, KV-cache layout, image geometry, token ids, RoPE, decoding
defaults, file sizes and hashes).  Every consumer — backends, model, bench, check, serve, export, INT8 — takes
its values from an `Artifact`; code never parses meaning out of file names.  One name per quantity:

    cache_len       static KV-cache length per slot, tokens (prompt + output)
    prefill_len     longest prompt the decoder's prefill accepts, tokens
    slots           sequences the decoder and KV cache hold at once (pages decoded together)
    n_image_tokens  image embeddings per page (merged patches + one newline per row + begin/end)
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from edgeocr.errors import ArtifactError

FORMAT = "edgeocr-artifact"
FORMAT_VERSION = 2          # 2: slots (batch dim in the decoder and KV cache), cache_len/prefill_len names
MANIFEST = "manifest.json"
DEFAULT_REPETITION_PENALTY = 1.08    # HunyuanOCR 1.5's decoding contract, when a checkpoint states none


def image_token_count(canvas: int, patch_size: int, merge_size: int) -> int:
    """Image embeddings for a square canvas: (g/m) rows of (g/m + 1) merged tokens (one newline token per
    row), plus the begin and end tokens; g = canvas / patch_size.  1024 px, patch 16, merge 2: 1058."""
    g = canvas // patch_size // merge_size
    return g * (g + 1) + 2


@dataclass(frozen=True)
class ImageSpec:
    canvas: int                       # square model input edge, pixels (letterboxed, top-left placed)
    patch_size: int                   # ViT patch edge, pixels
    merge_size: int                   # patches merged per axis by the adapter
    n_image_tokens: int               # image embeddings per page (see image_token_count)
    mean: tuple[float, ...]           # per-channel normalization mean, RGB, 0..1 scale
    std: tuple[float, ...]            # per-channel normalization std, RGB
    pad_value: int                    # letterbox fill, 0..255
    resample: str = "bicubic"         # letterbox resize filter (Pillow's, like the reference processor)
    placement: str = "top-left"       # where the resized page sits on the canvas

    @property
    def grid(self) -> int:            # patches per canvas edge
        return self.canvas // self.patch_size


@dataclass(frozen=True)
class KVCache:
    layers: int                       # decoder layers
    kv_heads: int                     # key/value heads per layer
    head_dim: int                     # values per head
    cache_len: int                    # rows per slot, tokens
    slots: int                        # sequences held at once
    dtype: str                        # "float32" | "float16"
    layout: str = "per layer: past_key_i / past_value_i [slots, kv_heads, cache_len, head_dim]"

    @property
    def bytes_per_token(self) -> int:         # K and V of every layer for one token of one slot
        return 2 * self.layers * self.kv_heads * self.head_dim * (2 if self.dtype == "float16" else 4)

    @property
    def bytes(self) -> int:                   # the whole static cache, all slots
        return self.bytes_per_token * self.cache_len * self.slots

    @property
    def shape(self) -> tuple[int, int, int, int]:   # one layer's K (or V) buffer
        return (self.slots, self.kv_heads, self.cache_len, self.head_dim)


@dataclass(frozen=True)
class Tokens:
    bos: int
    eos: int
    eod: int
    pad: int
    image: int                        # image placeholder id: one per image embedding in the prompt
    im_start: int
    im_end: int
    user: int
    system_sep: int
    stop_ids: tuple[int, ...]         # generation ends on any of these


@dataclass(frozen=True)
class Rope:
    layout: str                       # "B" = transformers >= 5.13, "A" = vLLM / Tencent training (spec §4.3)
    theta: float
    alpha: float | None               # NTK alpha scaling of theta, or None
    sections: tuple[int, ...]         # XD-RoPE frequency sections per axis
    head_dim: int


@dataclass(frozen=True)
class Graph:
    file: str                         # ONNX file in the artifact directory (external data beside it)
    inputs: tuple[dict, ...]          # {"name", "shape" (ints and symbolic names), "dtype"}
    outputs: tuple[dict, ...]
    attention: str                    # vision: "masked" | "mha"; decoder: "masked" | "gqa"
    select_on_device: bool = False    # decoder: repetition penalty + argmax in the graph (next_token output)
    prefill_len: int = 0              # decoder: longest prompt, tokens
    step_state: bool = False          # decoder: the decode step reads its state (positions, input ids, seen) from
                                      # device buffers and writes the next step's (quantize.step_state)
    native_step: dict = field(default_factory=dict)   # decoder: the weights of edgeocr's own CUDA decode step
                                      # (quantize.native_step; {} for none): {"version", "file", "dtype", "tensors",
                                      # "inputs"}; the graph reads those weights as inputs the runtime binds

    def dtype_of(self, name: str) -> str:
        """dtype of input or output `name` as recorded at export."""
        for e in self.inputs + self.outputs:
            if e["name"] == name:
                return e["dtype"]
        raise ArtifactError(f"{self.file} has no input or output named {name!r}")


@dataclass(frozen=True)
class Artifact:
    precision: str                    # "fp32" | "fp16" | "int8" | "weight-int8"
    source: dict                      # {"checkpoint", "sha256", ...}: where it was made from
    model: dict                       # the checkpoint's architecture (quantize.checkpoint.ModelSpec as a dict)
    vision: Graph
    decoder: Graph
    kv: KVCache
    image: ImageSpec
    tokens: Tokens
    rope: Rope
    repetition_penalty: float         # decoding default
    tokenizer: str                    # tokenizer.json file name
    files: dict                       # file name -> {"bytes", "sha256"}
    export: dict = field(default_factory=dict)     # tool versions, seconds, INT8 reports
    format_version: int = FORMAT_VERSION
    runtime: dict = field(default_factory=dict)    # {"onnxruntime": oldest version the graphs need, "why": ...}

    # ------------------------------------------------------------ derived
    @property
    def slots(self) -> int:
        return self.kv.slots

    @property
    def cache_len(self) -> int:
        return self.kv.cache_len

    @property
    def vocab_size(self) -> int:
        return self.model["text"]["vocab_size"]

    @property
    def hidden_size(self) -> int:
        return self.model["text"]["hidden_size"]

    def derive(self, **changes) -> "Artifact":
        """A copy with some fields changed (INT8 / weight-INT8 builds describe their output this way)."""
        return replace(self, **changes)

    # ------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "format_version": self.format_version, "precision": self.precision,
            "source": self.source, "model": self.model,
            "graphs": {"vision": asdict(self.vision), "decoder": asdict(self.decoder)},
            "kv_cache": {**asdict(self.kv), "bytes_per_token": self.kv.bytes_per_token},
            "preprocess": asdict(self.image), "tokens": asdict(self.tokens), "rope": asdict(self.rope),
            "decode": {"repetition_penalty": self.repetition_penalty},
            "tokenizer": self.tokenizer, "files": self.files, "export": self.export, "runtime": self.runtime,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    @classmethod
    def from_dict(cls, raw: dict, where: str = MANIFEST) -> "Artifact":
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            found = raw.get("format") if isinstance(raw, dict) else None
            raise ArtifactError(f"{where}: not an edgeocr manifest (format={found!r})")
        ver = raw.get("format_version")
        if ver != FORMAT_VERSION:
            raise ArtifactError(f"{where}: format_version {ver!r}, but this edgeocr reads version {FORMAT_VERSION}; "
                                "re-export the artifact with this edgeocr version")
        try:
            g = raw["graphs"]
            art = cls(
                precision=raw["precision"], source=raw["source"], model=raw["model"],
                vision=_typed(Graph, g["vision"]), decoder=_typed(Graph, g["decoder"]),
                kv=_typed(KVCache, raw["kv_cache"]), image=_typed(ImageSpec, raw["preprocess"]),
                tokens=_typed(Tokens, raw["tokens"]), rope=_typed(Rope, raw["rope"]),
                repetition_penalty=float(raw["decode"]["repetition_penalty"]), tokenizer=raw["tokenizer"],
                files=raw["files"], export=raw.get("export", {}), format_version=ver,
                runtime=dict(raw.get("runtime") or {}))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ArtifactError(f"{where}: malformed or missing field ({type(e).__name__}: {e})") from None
        if not isinstance(art.files, dict) or not all(isinstance(v, dict) for v in art.files.values()):
            raise ArtifactError(f"{where}: files must map each file name to its {{bytes, sha256}}, "
                                f"not {type(art.files).__name__}")
        for what, value in (("kv_cache.slots", art.kv.slots), ("kv_cache.cache_len", art.kv.cache_len),
                            ("graphs.decoder.prefill_len", art.decoder.prefill_len)):
            if not isinstance(value, int) or value < 1:
                raise ArtifactError(f"{where}: {what} must be a positive integer, not {value!r}")
        return art


def _typed(cls, raw: dict):
    """A frozen dataclass from a JSON object: lists become tuples, unknown keys are ignored, missing ones
    without a default raise TypeError naming them."""
    names = {f.name for f in fields(cls)}
    vals = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in names}
    return cls(**vals)


# ------------------------------------------------------------------------------ the ONNX Runtime an artifact needs
# The oldest ONNX Runtime each kind of graph runs on, measured on the CPU provider (x86, 2026-12-04) with the
# demo model's artifacts and single-MatMul graphs; later rules raise the floor.  Earlier releases were not
# measured: 1.18's wheels do not import with NumPy 2, 1.19 was not run.
ORT_FLOOR = ("1.20.0", "every exported and fused flavour (masked, GroupQueryAttention, selection in the graph) "
                       "gives identical tokens on 1.20.1 and 1.32.0")
ORT_MATMUL_NBITS_8 = ("1.23.0", "8-bit MatMulNBits: 1.20.1 and 1.21.1 refuse it at load, 1.22.1 fails on the "
                                "first page unless accuracy_level is 4 (not measured off x86)")


def _version(v: str) -> tuple[int, ...]:
    """'1.23.2' / '1.24.0.dev20261101' / '1.20.0+cu124' -> (1, 23, 2) / (1, 24, 0) / (1, 20, 0)."""
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(v).strip())
    if not m:
        raise ValueError(f"not a version number: {v!r}")
    return tuple(int(x) for x in m.groups() if x is not None)


def graph_requirement(graphs: list) -> dict:
    """The oldest ONNX Runtime that runs every graph (ONNX ModelProtos) and why: {"onnxruntime", "why"}."""
    need = ORT_FLOOR
    for g in graphs:
        for n in g.graph.node:
            if n.op_type == "MatMulNBits" and any(a.name == "bits" and a.i == 8 for a in n.attribute):
                need = max(need, ORT_MATMUL_NBITS_8, key=lambda r: _version(r[0]))
    return {"onnxruntime": need[0], "why": need[1]}


def onnxruntime_requirement(art: Artifact) -> dict:
    """{"onnxruntime": version, "why": reason}: the manifest's, or, for a manifest written before artifacts
    stated it, what its build record implies (8-bit MatMulNBits for weight-only INT8)."""
    if art.runtime.get("onnxruntime"):
        return {"onnxruntime": str(art.runtime["onnxruntime"]), "why": str(art.runtime.get("why", ""))}
    w8 = art.export.get("weight_int8")
    need = ORT_MATMUL_NBITS_8 if w8 and w8.get("bits", 8) == 8 else ORT_FLOOR
    return {"onnxruntime": need[0], "why": need[1]}


def onnxruntime_shortfall(art: Artifact, installed: str) -> str | None:
    """None when ONNX Runtime `installed` can run the artifact's graphs, else the message saying why not."""
    req = onnxruntime_requirement(art)
    if _version(installed) >= _version(req["onnxruntime"]):
        return None
    return (f"this artifact needs ONNX Runtime >= {req['onnxruntime']} ({req['why']}); this one is {installed}: "
            f"pip install 'onnxruntime>={req['onnxruntime']}' (or onnxruntime-gpu), or use an artifact built "
            "without that graph feature")


def cuda_only_problem(art: Artifact) -> str | None:
    """None when the artifact's graphs run on every ONNX Runtime provider, else what holds them to the CUDA one and
    how to rebuild it (the runtime's refusal off CUDA and `edgeocr doctor` say the same)."""
    ops = (art.export.get("fusion") or {}).get("cuda_only_ops")
    if not ops:
        return None
    return (f"this artifact holds ops only ONNX Runtime's CUDA provider runs ({'; '.join(ops)}); fuse the exported "
            "artifact with `python -m quantize fuse --target portable` to run it elsewhere (a packed vision q|k|v "
            "alone: rebuild it with `quantize native-step --vision-qkv three`)")


def _stated_requirement(directory: Path, art: Artifact) -> Artifact:
    """The artifact with `runtime` computed from its graphs on disk (op types only; no weights are read).
    Every toolchain writer goes through write(), so each artifact states what its own graphs need."""
    try:
        import onnx
    except ImportError:               # runtime-only install: keep what the manifest says
        return art
    paths = [directory / g.file for g in (art.vision, art.decoder)]
    if not all(p.exists() for p in paths):
        return art
    graphs = [onnx.load(str(p), load_external_data=False) for p in paths]
    return replace(art, runtime=graph_requirement(graphs))


def write(directory: Path, art: Artifact) -> None:
    """Atomic write of manifest.json: a reader never sees half a manifest.  The `runtime` requirement is
    computed from the graphs in `directory`."""
    directory = Path(directory)
    art = _stated_requirement(directory, art)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".manifest.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(art.to_json())
    os.chmod(tmp, 0o644)
    os.replace(tmp, directory / MANIFEST)


def read(directory: Path) -> Artifact:
    """Read and check an artifact directory's manifest (and that every listed file is there, whole)."""
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
    art = Artifact.from_dict(raw, str(path))
    for name, info in art.files.items():
        p = directory / name
        if not p.exists():
            raise ArtifactError(f"{directory}: manifest lists {name}, which is missing")
        if p.stat().st_size != info.get("bytes"):
            raise ArtifactError(f"{p}: size {p.stat().st_size} differs from the manifest's {info.get('bytes')}; "
                                "the artifact is incomplete or was modified")
    return art
