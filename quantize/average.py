"""`python -m quantize average A B OUT [--weight W]`: the weighted mean of two checkpoints of one architecture.

Every tensor of OUT is (1 - W) * A + W * B, computed in float32 and stored in A's dtype, with A's tensor names
and shard layout; config.json, the tokenizer and the generation config are A's.  Both checkpoints must have the
same config (dtype fields aside) and the same tensor names, shapes and dtypes: typically a checkpoint and one
trained further from it, whose mean can keep what each does better (the demo model's "soup": the "grow2"
weights and a stage trained from them on 400 new HTML pages, docs/demo-model/2026-12-04-reading-plateau.md,
Q17).  The trainer's glyph_head.pt is averaged the same way when both have one, so a stage can continue OUT.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from edgeocr.errors import CheckpointError
from quantize.checkpoint import GLYPH_HEAD, weight_files

log = logging.getLogger("edgeocr.quantize")

_DTYPE_KEYS = {"dtype", "torch_dtype"}      # where transformers records the dtype it saved in: may differ


@dataclass(frozen=True)
class AverageResult:
    tensors: int
    parameters: int
    glyph_head: bool            # OUT has an averaged glyph_head.pt


def _config(ckpt: Path) -> dict:
    path = ckpt / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: {e}") from None


def _difference(a, b, where: str = "") -> str | None:
    """The first place two configs differ (dtype fields aside), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in _DTYPE_KEYS:
                continue
            if k not in a or k not in b:
                return f"{where}{k} (only in {'B' if k not in a else 'A'})"
            d = _difference(a[k], b[k], f"{where}{k}.")
            if d:
                return d
        return None
    return None if a == b else f"{where.rstrip('.')} ({a!r} against {b!r})"


def _tensor_files(ckpt: Path) -> dict[str, Path]:
    from safetensors import safe_open

    where = {}
    for f in weight_files(ckpt):
        with safe_open(f, "pt") as h:
            for name in h.keys():
                where[name] = f
    return where


def average(a: Path, b: Path, out: Path, weight: float = 0.5,
            progress: Callable[[str], None] | None = None) -> AverageResult:
    """(1 - weight) * A + weight * B into OUT (a new or empty directory); see the module doc."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    a, b, out = Path(a), Path(b), Path(out)
    if not 0.0 <= float(weight) <= 1.0:
        raise ValueError(f"--weight must be within [0, 1] (0 gives A, 1 gives B), not {weight}")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty")
    diff = _difference(_config(a), _config(b))
    if diff:
        raise CheckpointError(f"{a} and {b} are not one architecture: their config.json differ at {diff}")
    files_a, files_b = _tensor_files(a), _tensor_files(b)
    if set(files_a) != set(files_b):
        only = sorted(set(files_a) ^ set(files_b))
        raise CheckpointError(f"{a} and {b} hold different tensors ({len(only)} in one only, e.g. {only[0]})")
    out.mkdir(parents=True, exist_ok=True)
    w = float(weight)

    def mix(ta, tb):
        return ((1 - w) * ta.float() + w * tb.float()).to(ta.dtype)

    n_params = 0
    shards_a = weight_files(a)
    with ExitStack() as stack:
        handles_b = {f: stack.enter_context(safe_open(f, "pt")) for f in set(files_b.values())}
        for fa in shards_a:
            mixed = {}
            with safe_open(fa, "pt") as ha:
                meta = ha.metadata()
                for name in ha.keys():
                    ta, tb = ha.get_tensor(name), handles_b[files_b[name]].get_tensor(name)
                    if ta.shape != tb.shape or ta.dtype != tb.dtype:
                        raise CheckpointError(f"{name}: {tuple(ta.shape)} {ta.dtype} in A, {tuple(tb.shape)} "
                                              f"{tb.dtype} in B")
                    if ta.is_floating_point():
                        mixed[name] = mix(ta, tb)
                    elif torch.equal(ta, tb):
                        mixed[name] = ta
                    else:
                        raise CheckpointError(f"{name}: an integer tensor that differs between A and B cannot be "
                                              "averaged")
                    n_params += ta.numel()
            save_file(mixed, str(out / fa.name), metadata=meta)
            if progress:
                progress(f"{fa.name}: {len(mixed)} tensors, {(1 - w):g} x A + {w:g} x B")
    weight_names = {f.name for f in shards_a}
    for f in a.iterdir():
        if f.is_file() and f.name not in weight_names and f.name != GLYPH_HEAD:
            shutil.copy2(f, out / f.name)
    head = (a / GLYPH_HEAD).exists() and (b / GLYPH_HEAD).exists()
    if head:
        ha, hb = (torch.load(p / GLYPH_HEAD, map_location="cpu", weights_only=True) for p in (a, b))
        if set(ha) != set(hb) or any(ha[k].shape != hb[k].shape for k in ha):
            raise CheckpointError(f"the two {GLYPH_HEAD} files differ in their tensors")
        torch.save({k: mix(ha[k], hb[k]) for k in ha}, out / GLYPH_HEAD)
    elif (a / GLYPH_HEAD).exists() or (b / GLYPH_HEAD).exists():
        log.warning("only one checkpoint has a %s: OUT gets none (a stage continuing OUT starts a fresh head)",
                    GLYPH_HEAD)
    return AverageResult(tensors=len(files_a), parameters=n_params, glyph_head=head)
