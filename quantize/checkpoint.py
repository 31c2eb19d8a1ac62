"""Load a HunyuanOCR (HunyuanVL) checkpoint directory as published on Hugging Face.

Reads config.json (flat Tencent layout or transformers' nested `text_config`), generation_config.json,
tokenizer.json, and safetensors with the on-disk legacy tensor names (spec §2), one file or sharded
with an index, with lm_head tied or stored.  Every size and token id comes from the checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgeocr.artifact import DEFAULT_REPETITION_PENALTY
from edgeocr.errors import CheckpointError

log = logging.getLogger("edgeocr.quantize")


@dataclass(frozen=True)
class TextSpec:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int               # may differ from hidden_size / num_heads (real model: 128 vs 64)
    rms_norm_eps: float
    rope_theta: float
    rope_alpha: float | None    # NTK-alpha; base = theta * alpha ** (head_dim / (head_dim - 2))
    rope_sections: tuple[int, ...]   # per-axis half-dims (p, w, h, t); sums to head_dim / 2
    tie_word_embeddings: bool
    max_position_embeddings: int


@dataclass(frozen=True)
class VisionSpec:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    patch_size: int
    spatial_merge_size: int
    max_image_size: int         # position grid edge = max_image_size // patch_size
    out_hidden_size: int
    eps: float                  # used for both the ViT LayerNorms and the merger RMSNorms
    interpolate_mode: str


@dataclass(frozen=True)
class TokenSpec:
    bos: int
    pad: int | None
    eos: int
    eod: int | None
    image: int
    im_start: int
    im_end: int
    im_newline: int | None
    user: int
    system_sep: int
    stop_ids: tuple[int, ...]   # generation stops on any of these


@dataclass(frozen=True)
class ModelSpec:
    text: TextSpec
    vision: VisionSpec
    tokens: TokenSpec
    repetition_penalty: float   # generation_config's, else DEFAULT_REPETITION_PENALTY (HunyuanOCR 1.5's)

    def to_dict(self) -> dict:
        return asdict(self)


# the trainer's auxiliary glyph head (quantize.train.glyph), kept beside a checkpoint's weights so that a stage can
# continue it; transformers ignores it and it is never shipped
GLYPH_HEAD = "glyph_head.pt"
USER_TOKEN = "<｜hy_User｜>"
SYSTEM_SEP_TOKEN = "<｜hy_place▁holder▁no▁3｜>"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path.parent}: missing {path.name}; not a Hugging Face checkpoint") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def _need(cfg: dict, key: str, where: str):
    if key not in cfg or cfg[key] is None:
        raise CheckpointError(f"config.json: {where} lacks '{key}'")
    return cfg[key]


def _rope(tc: dict) -> tuple[float, float | None, tuple[int, ...]]:
    """Rope base, alpha and sections from either the legacy `rope_scaling` or transformers' `rope_parameters`."""
    rp = tc.get("rope_parameters") or {}
    rs = tc.get("rope_scaling") or {}
    theta = rp.get("rope_theta", tc.get("rope_theta", 10000.0))
    alpha = rp.get("alpha", rs.get("alpha"))
    sections = rp.get("mrope_section") or rs.get("xdrope_section") or rs.get("mrope_section")
    if not sections:
        raise CheckpointError("config.json: no XD-RoPE sections (rope_scaling.xdrope_section / rope_parameters.mrope_section)")
    return float(theta), (float(alpha) if alpha else None), tuple(int(s) for s in sections)


def read_spec(ckpt: Path) -> ModelSpec:
    ckpt = Path(ckpt)
    if not ckpt.is_dir():
        raise CheckpointError(f"{ckpt}: not a directory")
    cfg = _read_json(ckpt / "config.json")
    archs = cfg.get("architectures") or []
    if cfg.get("model_type") != "hunyuan_vl" and "HunYuanVLForConditionalGeneration" not in archs:
        raise CheckpointError(
            f"{ckpt}: config.json has model_type={cfg.get('model_type')!r}, architectures={archs}; "
            "expected a HunyuanVL checkpoint (model_type 'hunyuan_vl')")
    tc = cfg.get("text_config")
    if tc is None:                      # Tencent's flat layout: text fields at the top level
        tc = cfg
        where = "the top level (flat config)"
    else:
        where = "text_config"
    vc = cfg.get("vision_config")
    if not isinstance(vc, dict):
        raise CheckpointError("config.json lacks 'vision_config'")

    theta, alpha, sections = _rope(tc)
    heads = int(_need(tc, "num_attention_heads", where))
    hidden = int(_need(tc, "hidden_size", where))
    head_dim = int(tc.get("head_dim") or tc.get("attention_head_dim") or hidden // heads)
    if sum(sections) * 2 != head_dim:
        raise CheckpointError(f"config.json: rope sections {list(sections)} do not sum to head_dim/2 = {head_dim // 2}")
    tie = bool(cfg.get("tie_word_embeddings", tc.get("tie_word_embeddings", True)))
    text = TextSpec(
        vocab_size=int(_need(tc, "vocab_size", where)), hidden_size=hidden,
        intermediate_size=int(_need(tc, "intermediate_size", where)),
        num_layers=int(_need(tc, "num_hidden_layers", where)), num_heads=heads,
        num_kv_heads=int(tc.get("num_key_value_heads") or heads), head_dim=head_dim,
        rms_norm_eps=float(tc.get("rms_norm_eps", 1e-5)), rope_theta=theta, rope_alpha=alpha,
        rope_sections=sections, tie_word_embeddings=tie,
        max_position_embeddings=int(tc.get("max_position_embeddings", 32768)),
    )
    if text.num_heads % text.num_kv_heads:
        raise CheckpointError(f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads {text.num_kv_heads}")
    vis = VisionSpec(
        hidden_size=int(_need(vc, "hidden_size", "vision_config")),
        intermediate_size=int(_need(vc, "intermediate_size", "vision_config")),
        num_layers=int(_need(vc, "num_hidden_layers", "vision_config")),
        num_heads=int(_need(vc, "num_attention_heads", "vision_config")),
        patch_size=int(vc.get("patch_size", 16)), spatial_merge_size=int(vc.get("spatial_merge_size", 2)),
        max_image_size=int(vc.get("max_image_size", 2048)),
        out_hidden_size=int(vc.get("out_hidden_size", hidden)),
        eps=float(vc.get("rms_norm_eps", vc.get("layer_norm_eps", 1e-5))),
        interpolate_mode=str(vc.get("interpolate_mode", "bilinear")),
    )
    if vis.out_hidden_size != text.hidden_size:
        raise CheckpointError(f"config.json: vision out_hidden_size {vis.out_hidden_size} != text hidden_size {text.hidden_size}")

    gen = {}
    if (ckpt / "generation_config.json").exists():
        gen = _read_json(ckpt / "generation_config.json")
    tokenizer_path = ckpt / "tokenizer.json"
    if not tokenizer_path.exists():
        raise CheckpointError(f"{ckpt}: missing tokenizer.json")
    from tokenizers import Tokenizer
    try:
        tok = Tokenizer.from_file(str(tokenizer_path))
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise CheckpointError(f"{tokenizer_path}: cannot be loaded by `tokenizers` ({e})") from None

    def by_name(name: str) -> int:
        i = tok.token_to_id(name)
        if i is None:
            raise CheckpointError(f"tokenizer.json lacks the special token {name}")
        return i

    def as_list(v) -> list[int]:
        if v is None:
            return []
        return [int(x) for x in (v if isinstance(v, list) else [v])]

    eos_cfg = as_list(tc.get("eos_token_id", cfg.get("eos_token_id")))
    eos_gen = as_list(gen.get("eos_token_id"))
    eod = tc.get("eod_token_id", cfg.get("eod_token_id"))
    eos = (eos_cfg or eos_gen or [None])[0]
    if eos is None:
        raise CheckpointError("config.json and generation_config.json give no eos_token_id")
    stop = list(dict.fromkeys(eos_gen + eos_cfg))
    tokens = TokenSpec(
        bos=int(_need(tc if "bos_token_id" in tc else cfg, "bos_token_id", where)),
        pad=tc.get("pad_token_id", cfg.get("pad_token_id")),
        eos=int(eos), eod=None if eod is None else int(eod),
        image=int(_need(cfg, "image_token_id", "the top level")),
        im_start=int(_need(cfg, "im_start_id", "the top level")),
        im_end=int(_need(cfg, "im_end_id", "the top level")),
        im_newline=cfg.get("im_newline_id"),
        user=by_name(USER_TOKEN), system_sep=by_name(SYSTEM_SEP_TOKEN),
        stop_ids=tuple(stop),
    )
    for name in ("bos", "eos", "image", "im_start", "im_end", "user", "system_sep"):
        v = getattr(tokens, name)
        if not 0 <= v < text.vocab_size:
            raise CheckpointError(f"token id {name}={v} is outside the vocabulary (vocab_size {text.vocab_size})")
    if tok.get_vocab_size(with_added_tokens=True) > text.vocab_size:
        raise CheckpointError(
            f"tokenizer.json has {tok.get_vocab_size(with_added_tokens=True)} tokens, more than vocab_size {text.vocab_size}")
    return ModelSpec(text=text, vision=vis, tokens=tokens,
                     repetition_penalty=float(gen.get("repetition_penalty") or DEFAULT_REPETITION_PENALTY))


def expected_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint must hold, by on-disk (legacy) name (spec §2)."""
    t, v = spec.text, spec.vision
    H, D = t.hidden_size, t.head_dim
    s: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (t.vocab_size, H), "model.norm.weight": (H,)}
    for i in range(t.num_layers):
        p = f"model.layers.{i}."
        s.update({
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (t.num_heads * D, H),
            p + "self_attn.k_proj.weight": (t.num_kv_heads * D, H),
            p + "self_attn.v_proj.weight": (t.num_kv_heads * D, H),
            p + "self_attn.o_proj.weight": (H, t.num_heads * D),
            p + "self_attn.query_layernorm.weight": (D,), p + "self_attn.key_layernorm.weight": (D,),
            p + "mlp.gate_proj.weight": (t.intermediate_size, H), p + "mlp.up_proj.weight": (t.intermediate_size, H),
            p + "mlp.down_proj.weight": (H, t.intermediate_size),
        })
    C, I, P = v.hidden_size, v.intermediate_size, v.patch_size
    edge = v.max_image_size // P
    s.update({
        "vit.embeddings.patch_embedding.weight": (C, 3, P, P), "vit.embeddings.patch_embedding.bias": (C,),
        "vit.embeddings.position_embedding.weight": (edge * edge + 1, C),
    })
    for j in range(v.num_layers):
        p = f"vit.layers.{j}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            s[p + n + ".weight"] = (C,)
            s[p + n + ".bias"] = (C,)
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            s[p + f"self_attn.{n}.weight"] = (C, C)
            s[p + f"self_attn.{n}.bias"] = (C,)
        s[p + "mlp.dense_h_to_4h.weight"] = (I, C)
        s[p + "mlp.dense_h_to_4h.bias"] = (I,)
        s[p + "mlp.dense_4h_to_h.weight"] = (C, I)
        s[p + "mlp.dense_4h_to_h.bias"] = (C,)
    m = v.spatial_merge_size
    s.update({
        "vit.perceive.before_rms.weight": (C,),
        "vit.perceive.proj.0.weight": (2 * C, C, m, m), "vit.perceive.proj.0.bias": (2 * C,),
        "vit.perceive.proj.2.weight": (4 * C, 2 * C, 1, 1), "vit.perceive.proj.2.bias": (4 * C,),
        "vit.perceive.mlp.weight": (H, 4 * C), "vit.perceive.mlp.bias": (H,),
        "vit.perceive.image_newline": (4 * C,), "vit.perceive.image_begin": (H,), "vit.perceive.image_end": (H,),
        "vit.perceive.after_rms.weight": (H,),
    })
    if not t.tie_word_embeddings:
        s["lm_head.weight"] = (t.vocab_size, H)
    return s


def weight_files(ckpt: Path) -> list[Path]:
    ckpt = Path(ckpt)
    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        wm = _read_json(index).get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise CheckpointError(f"{index}: no weight_map")
        files = [ckpt / f for f in dict.fromkeys(wm.values())]
        for f in files:
            if not f.exists():
                raise CheckpointError(f"{index} names shard {f.name}, which is missing")
        return files
    single = ckpt / "model.safetensors"
    if single.exists():
        return [single]
    raise CheckpointError(f"{ckpt}: no model.safetensors or model.safetensors.index.json")


def load_tensors(ckpt: Path, spec: ModelSpec) -> dict[str, np.ndarray]:
    """All tensors as float32 numpy arrays, validated against `expected_shapes`.  lm_head is
    materialized from the embedding when tied (and not stored)."""
    from safetensors import safe_open

    want = expected_shapes(spec)
    out: dict[str, np.ndarray] = {}
    for f in weight_files(ckpt):
        try:
            # framework "pt" reads bf16; it is only needed here, in the offline toolchain.
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():
                    if k in want or k == "lm_head.weight" or k == "vit.perceive.image_sep":
                        out[k] = h.get_tensor(k).float().numpy()
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"{f}: cannot be read as safetensors ({e})") from None
    missing = [k for k in want if k not in out]
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(f"checkpoint is missing tensor(s) {missing[:5]}{more}")
    for k, shape in want.items():
        if tuple(out[k].shape) != shape:
            raise CheckpointError(f"tensor {k} has shape {list(out[k].shape)}, expected {list(shape)} from config.json")
    if "lm_head.weight" not in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    elif tuple(out["lm_head.weight"].shape) != (spec.text.vocab_size, spec.text.hidden_size):
        raise CheckpointError(f"tensor lm_head.weight has shape {list(out['lm_head.weight'].shape)}")
    return out


def checkpoint_hash(ckpt: Path) -> str:
    """sha256 over config.json, generation_config.json, tokenizer.json and the weight files."""
    ckpt = Path(ckpt)
    h = hashlib.sha256()
    names = ["config.json", "generation_config.json", "tokenizer.json"] + [p.name for p in weight_files(ckpt)]
    for n in names:
        p = ckpt / n
        if not p.exists():
            continue
        h.update(n.encode())
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()
