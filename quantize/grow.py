"""`python -m quantize grow`: a deeper copy of a HunyuanVL checkpoint that computes exactly the same function.

New decoder and vision-encoder layers are inserted between the existing ones (`layer_plan`); each is a copy of
the SRC layer just before it (or, with `init="fresh"`, a seeded fresh init: projections N(0,
initializer_range), norms 1, biases 0) whose residual writers are zero: in a decoder layer the attention's
`o_proj` and the MLP's `down_proj`, in a vision block `o_proj` and `dense_4h_to_h` (transformers' `fc2`), with
their biases.  Both layer kinds are pre-norm, `x + attn(norm1(x))` then `x + mlp(norm2(x))`, with no norm
after the add, no layer scale and nothing that reads the layer index but the KV cache slot, so a new layer
adds exactly 0.0 and every old layer sees bit-identical inputs (the LLaMA Pro block expansion).  Training
then moves the zeroed projections first (their gradient is the residual gradient times the copied layer's
features), the rest of the new layer after that.  Everything else of SRC is copied as it is: tensor names
(on-disk ones, renumbered), dtypes, shard layout, config.json but the two layer counts, the tokenizer and
generation config, the trainer's glyph_head.pt (it reads the merger's output, text hidden size wide, which
growing does not change).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgeocr.errors import CheckpointError
from quantize.checkpoint import GLYPH_HEAD, weight_files

log = logging.getLogger("edgeocr.quantize")

SHIPPED_LIMIT = 16 * 2**20      # bytes: the shipped demo model's budget on disk (reported, not enforced)

# A layer's tensors by name suffix -> role.  "write": adds into the residual stream (zero in a new layer);
# "read": reads the normed residual (copied, or N(0, std) when fresh); "norm" / "bias": 1 / 0 when fresh.
_TEXT_ROLES = {
    "input_layernorm.weight": "norm", "post_attention_layernorm.weight": "norm",
    "self_attn.query_layernorm.weight": "norm", "self_attn.key_layernorm.weight": "norm",
    "self_attn.q_proj.weight": "read", "self_attn.k_proj.weight": "read", "self_attn.v_proj.weight": "read",
    "self_attn.q_proj.bias": "bias", "self_attn.k_proj.bias": "bias", "self_attn.v_proj.bias": "bias",
    "self_attn.o_proj.weight": "write", "self_attn.o_proj.bias": "write",           # attention_bias: true
    "mlp.gate_proj.weight": "read", "mlp.up_proj.weight": "read",
    "mlp.down_proj.weight": "write",
}
_VISION_ROLES = {
    "input_layernorm.weight": "norm", "input_layernorm.bias": "bias",               # on disk (legacy names)
    "post_attention_layernorm.weight": "norm", "post_attention_layernorm.bias": "bias",
    "layer_norm1.weight": "norm", "layer_norm1.bias": "bias",                       # transformers' names
    "layer_norm2.weight": "norm", "layer_norm2.bias": "bias",
    "self_attn.q_proj.weight": "read", "self_attn.k_proj.weight": "read", "self_attn.v_proj.weight": "read",
    "self_attn.q_proj.bias": "bias", "self_attn.k_proj.bias": "bias", "self_attn.v_proj.bias": "bias",
    "self_attn.o_proj.weight": "write", "self_attn.o_proj.bias": "write",
    "mlp.dense_h_to_4h.weight": "read", "mlp.dense_h_to_4h.bias": "bias",
    "mlp.fc1.weight": "read", "mlp.fc1.bias": "bias",
    "mlp.dense_4h_to_h.weight": "write", "mlp.dense_4h_to_h.bias": "write",
    "mlp.fc2.weight": "write", "mlp.fc2.bias": "write",
}


@dataclass(frozen=True)
class _Tower:
    what: str                   # "decoder" / "vision-encoder", for messages
    flag: str                   # the command-line flag that sets its layer count
    pattern: re.Pattern         # a layer tensor's name -> (prefix, index, suffix)
    roles: dict[str, str]       # suffix -> role
    writers: tuple[tuple[str, ...], ...]   # every layer must hold one suffix of each group (attention, MLP)


_TEXT = _Tower("decoder", "--text-layers", re.compile(r"^(model\.(?:language_model\.)?layers)\.(\d+)\.(.+)$"),
               _TEXT_ROLES, (("self_attn.o_proj.weight",), ("mlp.down_proj.weight",)))
_VISION = _Tower("vision-encoder", "--vision-layers",
                 re.compile(r"^((?:model\.)?(?:vit|vision_tower)\.layers)\.(\d+)\.(.+)$"), _VISION_ROLES,
                 (("self_attn.o_proj.weight",), ("mlp.dense_4h_to_h.weight", "mlp.fc2.weight")))


@dataclass(frozen=True)
class GrowOptions:
    text_layers: int | None = None      # decoder layers of OUT (None: SRC's)
    vision_layers: int | None = None    # vision-encoder layers of OUT (None: SRC's)
    init: str = "copy"                  # a new layer's non-zero tensors: "copy" of the SRC layer before it, "fresh"
    seed: int = 0                       # the fresh init's draws (init="fresh" only)


@dataclass(frozen=True)
class GrowReport:
    text_plan: tuple[int | None, ...]     # OUT decoder layer k is SRC layer text_plan[k]; None = new
    vision_plan: tuple[int | None, ...]   # the same for the vision encoder
    params_before: int                    # stored parameters (a tied lm_head once)
    params_after: int
    weight_bytes_before: int              # the safetensors file(s)
    weight_bytes_after: int
    disk_bytes_after: int                 # every file of OUT but the trainer's glyph_head.pt


def layer_plan(old: int, new: int) -> list[int | None]:
    """OUT's layers in order: SRC layer i, or None for a new layer.  SRC layer i goes to position
    floor(i * (new - 1) / (old - 1) + 1/2), so the first and last SRC layers stay first and last (they touch the
    embeddings and the final norm) and the new layers fall evenly into the gaps between; a one-layer SRC gets
    its new layers after it.  A new layer copies the SRC layer just before it."""
    if not 1 <= old <= new:
        raise ValueError(f"cannot grow {old} layers to {new}")
    plan: list[int | None] = [None] * new
    for i in range(old):
        plan[i if old == 1 else (2 * i * (new - 1) + old - 1) // (2 * (old - 1))] = i
    return plan


def _sections(cfg: dict) -> tuple[dict, dict]:
    """config.json's text section (nested text_config, or the top level of Tencent's flat layout) and vision_config."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    vision = cfg.get("vision_config")
    if not isinstance(vision, dict):
        raise CheckpointError("config.json lacks 'vision_config'")
    for where, sec in (("text", text), ("vision", vision)):
        if not isinstance(sec.get("num_hidden_layers"), int):
            raise CheckpointError(f"config.json: the {where} section lacks an integer 'num_hidden_layers'")
        per_layer = [k for k, v in sec.items() if "layer" in k and isinstance(v, list)]
        if per_layer:                   # per-layer settings (layer_types, ...) would need growing too
            raise CheckpointError(f"config.json: the {where} section has per-layer list(s) {per_layer}; "
                                  "growing cannot tell how to extend them")
    return text, vision


def _targets(text: dict, vision: dict, opts: GrowOptions) -> tuple[int, int]:
    """OUT's layer counts, refused unless each is at least SRC's and one is larger."""
    old_t, old_v = text["num_hidden_layers"], vision["num_hidden_layers"]
    new_t = old_t if opts.text_layers is None else opts.text_layers
    new_v = old_v if opts.vision_layers is None else opts.vision_layers
    for flag, what, old, new in (("--text-layers", "decoder", old_t, new_t),
                                 ("--vision-layers", "vision-encoder", old_v, new_v)):
        if new < old:
            raise ValueError(f"{flag} {new} is smaller than SRC's {old} {what} layers: grow only adds layers")
    if (new_t, new_v) == (old_t, old_v):
        raise ValueError(f"--text-layers {new_t} and --vision-layers {new_v} equal SRC's {old_t} decoder and "
                         f"{old_v} vision-encoder layers: give at least one of them a larger count")
    if opts.init not in ("copy", "fresh"):
        raise ValueError(f"init must be 'copy' or 'fresh', not {opts.init!r}")
    return new_t, new_v


def _layers(tensors: dict[str, str], tower: _Tower, count: int) -> dict[int, dict[str, str]]:
    """SRC's layer tensors of one tower, {index: {suffix: name}}, checked against config and the known layout."""
    layers: dict[int, dict[str, str]] = {}
    for name in tensors:
        m = tower.pattern.match(name)
        if m:
            layers.setdefault(int(m[2]), {})[m[3]] = name
    if sorted(layers) != list(range(count)):
        raise CheckpointError(f"config.json says {count} {tower.what} layers; the weights hold layers "
                              f"{sorted(layers)[:8]}{' ...' if len(layers) > 8 else ''}")
    for i, layer in layers.items():
        unknown = sorted(s for s in layer if s not in tower.roles)
        if unknown:
            raise CheckpointError(f"{tower.what} layer {i} holds {unknown}: not a dense HunyuanVL layer this tool "
                                  "knows which tensors of write into the residual stream")
        for group in tower.writers:
            if not any(s in layer for s in group):
                raise CheckpointError(f"{tower.what} layer {i} lacks {' / '.join(group)}")
        if set(layer) != set(layers[0]):
            raise CheckpointError(f"{tower.what} layers 0 and {i} hold different tensors")
    return layers


def _write_json(path: Path, data: dict, like: Path) -> None:
    """JSON in the layout of `like` (two-space indent, its key order, its trailing newline)."""
    tail = "\n" if like.read_text(encoding="utf-8").endswith("\n") else ""
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + tail, encoding="utf-8")


def grow(src: Path, out: Path, opts: GrowOptions = GrowOptions(),
         progress: Callable[[str], None] | None = None) -> GrowReport:
    """SRC checkpoint directory -> OUT, a new directory holding the grown checkpoint.  Returns what changed."""
    say = progress or (lambda msg: log.info("%s", msg))
    src, out = Path(src), Path(out)
    cfg_path = src / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{src}: no config.json; not a Hugging Face checkpoint") from None
    text, vision = _sections(cfg)
    old_t, old_v = text["num_hidden_layers"], vision["num_hidden_layers"]
    new_t, new_v = _targets(text, vision, opts)
    if out.exists() and (not out.is_dir() or out.resolve() == src.resolve() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty folder: give a new or empty folder as OUT")
    files = weight_files(src)
    index_path = src / "model.safetensors.index.json"

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    say(f"reading {', '.join(f.name for f in files)}")
    shards: dict[str, dict[str, torch.Tensor]] = {}
    meta: dict[str, dict | None] = {}
    home: dict[str, str] = {}                                  # tensor name -> its file's name
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            meta[f.name] = h.metadata()
            shards[f.name] = {k: h.get_tensor(k) for k in h.keys()}
        home.update(dict.fromkeys(shards[f.name], f.name))
    params_before = sum(t.numel() for s in shards.values() for t in s.values())

    gen = torch.Generator().manual_seed(opts.seed)
    plans = {}
    renamed: dict[str, str] = {}                               # SRC name -> OUT name
    added: dict[str, tuple[str, torch.Tensor]] = {}            # OUT name -> (file, tensor)
    for tower, sec, old, new in ((_TEXT, text, old_t, new_t), (_VISION, vision, old_v, new_v)):
        layers = _layers(home, tower, old)
        plan = layer_plan(old, new)
        plans[tower.flag] = tuple(plan)
        std = float(sec.get("initializer_range", 0.02))
        before = 0
        for k, i in enumerate(plan):
            if i is not None:
                before = i
                for suffix, name in layers[i].items():
                    prefix = tower.pattern.match(name)[1]
                    renamed[name] = f"{prefix}.{k}.{suffix}"
                continue
            for suffix, name in sorted(layers[before].items()):   # sorted: the fresh draws' order is fixed
                t = shards[home[name]][name]
                role = tower.roles[suffix]
                if role == "write":
                    layer_t = torch.zeros_like(t)
                elif opts.init == "copy":
                    layer_t = t.clone()
                elif role == "read":
                    layer_t = (std * torch.randn(t.shape, generator=gen, dtype=torch.float32)).to(t.dtype)
                else:
                    layer_t = torch.ones_like(t) if role == "norm" else torch.zeros_like(t)
                added[f"{tower.pattern.match(name)[1]}.{k}.{suffix}"] = (home[name], layer_t)
        say(f"{tower.what} layers {old} -> {new}: "
            + " ".join(f"{i}" if i is not None else "+" for i in plan) + f" (+ = new, {opts.init})")

    out.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total_bytes = 0
    for fname, tensors in shards.items():
        shard = {renamed.get(k, k): v for k, v in tensors.items()}
        shard.update({k: t for k, (f, t) in added.items() if f == fname})
        save_file(shard, str(out / fname), metadata=meta[fname])
        shutil.copymode(src / fname, out / fname)          # save_file makes it 0600
        weight_map.update(dict.fromkeys(shard, fname))
        total_bytes += sum(t.numel() * t.element_size() for t in shard.values())
    params_after = params_before + sum(t.numel() for _, t in added.values())
    if index_path.exists():
        index = json.loads(index_path.read_text(encoding="utf-8"))
        index["weight_map"] = dict(sorted(weight_map.items()))
        md = index.setdefault("metadata", {})
        md["total_size"] = total_bytes
        if "total_parameters" in md:                       # transformers' count, whatever it counts: + the new
            md["total_parameters"] += params_after - params_before
        _write_json(out / index_path.name, index, index_path)

    text["num_hidden_layers"], vision["num_hidden_layers"] = new_t, new_v
    _write_json(out / "config.json", cfg, cfg_path)
    written = {"config.json", index_path.name, *(f.name for f in files)}
    for p in sorted(src.iterdir()):
        if p.name in written:
            continue
        if p.is_dir():
            shutil.copytree(p, out / p.name)
            log.warning("%s copied as it is: anything in it that names layers by index does not know the new "
                        "layers", p.name)
        else:
            shutil.copy2(p, out / p.name)

    return GrowReport(
        text_plan=plans[_TEXT.flag], vision_plan=plans[_VISION.flag],
        params_before=params_before, params_after=params_after,
        weight_bytes_before=sum(f.stat().st_size for f in files),
        weight_bytes_after=sum((out / f.name).stat().st_size for f in files),
        disk_bytes_after=sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.name != GLYPH_HEAD))
