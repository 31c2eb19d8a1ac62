"""Export a HunyuanVL checkpoint to a versioned edgeocr artifact directory.

    artifact/
      manifest.json        what everything is (edgeocr.artifact.Artifact, FORMAT_VERSION)
      vision.onnx (+ .data)   [1, 3, S, S] float32 pixels -> [N_img, H] image embeddings
      decoder.onnx (+ .data)  prefill (one sequence, S tokens) and decode (every slot, 1 token each) over a
                              static KV cache of `slots` sequences
      tokenizer.json
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path


from edgeocr import artifact as af
from edgeocr import preprocess
from quantize.checkpoint import ModelSpec, checkpoint_hash, load_tensors, read_spec

log = logging.getLogger("edgeocr.quantize")

OPSET = 17          # TensorRT 10.3 (JetPack 6) parses <= 20; 17 keeps LayerNormalization available
IR_VERSION = 8      # readable by ONNX Runtime >= 1.14 and TensorRT 10.x


@dataclass(frozen=True)
class ExportOptions:
    image_size: int = preprocess.CANVAS          # fixed square input, pixels
    cache_len: int = 4096                        # static KV cache length per slot, tokens (prompt + output)
    prefill_len: int = 2048                      # longest prompt the prefill profile accepts, tokens
    slots: int = 1                               # sequences decoded at once (KV cache [slots, ...] per layer)
    rope_layout: str = "B"                       # "B" = transformers >= 5.13, "A" = vLLM/Tencent training
    precision: str = "fp32"                      # "fp32" or "fp16" (weights and activations; norms/softmax/RoPE fp32)
    pad_value: int = preprocess.PAD_VALUE        # letterbox fill, 0..255 (white for documents)
    device: str = "cpu"                          # where torch traces the graphs ("cuda" is much faster for big models)
    # "masked" = portable ONNX ops (any runtime, TensorRT): decoder over the whole cache, new K/V rows out;
    # "gqa" = ONNX Runtime's fused attention ops: GroupQueryAttention in the decoder (cache updated in place,
    # live length only) and MultiHeadAttention in the vision encoder (flash attention on CUDA)
    attention: str = "masked"
    # greedy selection (repetition penalty + argmax) inside the decoder graph: one token id read back per step
    select_on_device: bool = False


def _torch_dtype(precision: str):
    import torch
    try:
        return {"fp32": torch.float32, "fp16": torch.float16}[precision]
    except KeyError:
        raise ValueError(f"precision must be 'fp32' or 'fp16', not {precision!r}") from None


def _save(model_proto, path: Path) -> None:
    """Save with weights in `<name>.data` beside the graph (stable name), explicit IR version."""
    import onnx

    model_proto.ir_version = IR_VERSION
    data = path.name + ".data"
    for p in (path, path.with_name(data)):
        if p.exists():
            p.unlink()
    onnx.save_model(model_proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data, size_threshold=1024)
    onnx.checker.check_model(str(path))


def _export(module, args, path: Path, input_names, output_names, dynamic_axes, device: str = "cpu") -> None:
    import tempfile

    import onnx
    import torch

    module = module.to(device)
    args = tuple(a.to(device) for a in args)
    # torch writes graphs > 2 GB with one external file per tensor: export into a scratch
    # directory, then re-save as <name>.onnx + <name>.onnx.data and drop the scratch.
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".export-") as tmpdir:
        tmp = Path(tmpdir) / "graph.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            # the TorchScript exporter is chosen on purpose (dynamo=False): its deprecation notices, and the
            # tracer's note that shapes become constants (the graphs are fixed-shape by design), are ours to
            # silence; every other warning still shows
            warnings.filterwarnings("ignore", "You are using the legacy TorchScript-based ONNX export",
                                    DeprecationWarning)
            warnings.filterwarnings("ignore", "The feature will be removed", DeprecationWarning, "torch.onnx")
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            torch.onnx.export(module, args, str(tmp), input_names=input_names, output_names=output_names,
                              dynamic_axes=dynamic_axes, opset_version=OPSET, dynamo=False,
                              do_constant_folding=True)
        proto = onnx.load(str(tmp), load_external_data=True)
        _save(proto, path)


def _io(path: Path) -> dict:
    """Graph I/O names, shapes (symbolic dims as strings) and dtypes, read back from the file."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)

    def desc(v):
        tt = v.type.tensor_type
        dims = [d.dim_param if d.dim_param else int(d.dim_value) for d in tt.shape.dim]
        return {"name": v.name, "shape": dims, "dtype": onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name}

    return {"inputs": tuple(desc(v) for v in m.graph.input), "outputs": tuple(desc(v) for v in m.graph.output)}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 22), b""):
            h.update(b)
    return h.hexdigest()


def copy_unwritten(src: Path, out: Path, files, written: set[str]) -> None:
    """Copy the artifact files (`files`: names under `src`) that a derivation did not write itself into `out`."""
    for name in files:
        if name not in written:
            dst = out / name
            if dst.exists() or dst.is_symlink():
                dst.unlink()      # not written through: `quantize reslot` hard-links an artifact's files
            shutil.copyfile(src / name, dst)


# what an artifact folder holds: graphs, their weights, tokenizer, manifest, native-step weights, TensorRT engines
# with their index and timing cache (edgeocr.trt_engines), a manifest being written
_ARTIFACT_FILES = re.compile(r"^(.+\.onnx|.+\.onnx\.data|.+\.engine|engines\.json(\.tmp)?|timing\.cache|"
                             r"tokenizer\.json|manifest\.json|decoder_step\.bin|\.manifest\..+\.tmp)$")


def prepare_out(out: Path, make: bool = True) -> None:
    """OUT for a toolchain pass, made if missing (make=False: only checked, before a long read).  An existing OUT
    must hold nothing but artifact files (an earlier artifact, or an interrupted pass's graphs): the manifest lists
    every file in OUT and makes it readable by all, so a folder of other files is refused rather than published."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file; OUT must be a directory")
    if out.is_dir():
        other = sorted(p.name for p in out.iterdir() if not (p.is_file() and _ARTIFACT_FILES.match(p.name)))
        if other:
            raise ValueError(f"{out} holds {', '.join(other[:3])}{' ...' if len(other) > 3 else ''}, which is not part "
                             "of an artifact: give an empty or new folder as OUT")
    if make:
        out.mkdir(parents=True, exist_ok=True)


def _file_table(out: Path) -> dict:
    """The artifact's files for its manifest (name -> bytes, sha256), each made readable by all: a daemon
    running as another user must be able to read the artifact."""
    table = {}
    for p in sorted(out.iterdir()):
        if p.is_file() and p.name != af.MANIFEST:
            p.chmod(0o644)
            table[p.name] = {"bytes": p.stat().st_size, "sha256": _sha256(p)}
    return table


def export(ckpt: Path, out: Path, opts: ExportOptions = ExportOptions(),
           progress: Callable[[str], None] | None = None) -> af.Artifact:
    """Checkpoint directory -> artifact directory.  Returns the written manifest."""
    import torch

    from quantize.torch_model import Decoder, DeviceSelect, VisionEncoder

    say = progress or (lambda msg: log.info("%s", msg))
    t0 = time.perf_counter()
    ckpt, out = Path(ckpt), Path(out)
    if opts.rope_layout not in ("A", "B"):
        raise ValueError(f"rope_layout must be 'A' or 'B', not {opts.rope_layout!r}")
    if opts.attention not in ("masked", "gqa"):
        raise ValueError(f"attention must be 'masked' or 'gqa', not {opts.attention!r}")
    if opts.prefill_len > opts.cache_len:
        raise ValueError(f"prefill_len ({opts.prefill_len}) cannot exceed cache_len ({opts.cache_len})")
    prepare_out(out, make=False)
    if not isinstance(opts.slots, int) or not 1 <= opts.slots <= 256:
        raise ValueError(f"slots must be an integer in 1..256, not {opts.slots!r}")
    dtype = _torch_dtype(opts.precision)
    spec: ModelSpec = read_spec(ckpt)
    say(f"reading weights from {ckpt}")
    w = load_tensors(ckpt, spec)
    src_hash = checkpoint_hash(ckpt)
    prepare_out(out)
    t, v = spec.text, spec.vision
    S = opts.image_size
    n_img = af.image_token_count(S, v.patch_size, v.spatial_merge_size)

    say(f"exporting vision graph [1, 3, {S}, {S}] -> [{n_img}, {t.hidden_size}] ({opts.precision})")
    ve = VisionEncoder(spec, w, S, dtype, fused_attention=opts.attention == "gqa").eval()
    _export(ve, (torch.zeros(1, 3, S, S),), out / "vision.onnx", ["pixels"], ["image_embeds"], None, opts.device)
    del ve

    say(f"exporting decoder graph: {t.num_layers} layers, KV cache {opts.slots} x {opts.cache_len} tokens")
    dec = Decoder(spec, w, opts.cache_len, dtype, attention=opts.attention).eval()
    L, kvh, d = t.num_layers, t.num_kv_heads, t.head_dim
    ex_b, ex_s = 2, 3          # example batch and length: both traced as dynamic axes
    past = [torch.zeros(ex_b, kvh, opts.cache_len, d, dtype=dtype) for _ in range(2 * L)]
    past_names = [f"past_key_{i}" for i in range(L)] + [f"past_value_{i}" for i in range(L)]
    dyn = {"input_ids": {0: "batch", 1: "seq"}, "cos": {0: "batch", 1: "seq"}, "sin": {0: "batch", 1: "seq"},
           "image_embeds": {0: "n_image"}, "logits": {0: "batch"}, **{n: {0: "batch"} for n in past_names}}
    # image_embeds in the compute dtype: the vision graph's output binds to it as it is (no cast, no copy)
    common = (torch.zeros(ex_b, ex_s, dtype=torch.int64), torch.zeros(n_img, t.hidden_size, dtype=dtype),
              torch.zeros(ex_b, ex_s, d), torch.zeros(ex_b, ex_s, d))
    if opts.attention == "gqa":
        args = (*common, torch.full((ex_b,), ex_s - 1, dtype=torch.int32), torch.tensor(ex_s, dtype=torch.int32),
                *past)
        in_names = ["input_ids", "image_embeds", "cos", "sin", "seqlens_k", "total_sequence_length", *past_names]
        out_names = [f"present_key_{i}" for i in range(L)] + [f"present_value_{i}" for i in range(L)]
        dyn["seqlens_k"] = {0: "batch"}
        dyn.update({n: {0: "batch"} for n in out_names})
    else:
        args = (*common, torch.zeros(ex_b, dtype=torch.int64), *past)
        in_names = ["input_ids", "image_embeds", "cos", "sin", "past_len", *past_names]
        out_names = [f"new_key_{i}" for i in range(L)] + [f"new_value_{i}" for i in range(L)]
        dyn["past_len"] = {0: "batch"}
        dyn.update({n: {0: "batch", 2: "seq"} for n in out_names})
    head = ["logits"]
    if opts.select_on_device:
        dec = DeviceSelect(dec).eval()
        args = (*args[:4], torch.zeros(ex_b, t.vocab_size), torch.full((ex_b,), spec.repetition_penalty), *args[4:])
        in_names = [*in_names[:4], "seen", "penalty", *in_names[4:]]
        head = ["logits", "next_token"]
        dyn.update({"seen": {0: "batch"}, "penalty": {0: "batch"}, "next_token": {0: "batch"}})
    _export(dec, args, out / "decoder.onnx", in_names, [*head, *out_names], dyn, opts.device)
    del dec, w

    shutil.copyfile(ckpt / "tokenizer.json", out / "tokenizer.json")
    tk = spec.tokens
    m = af.Artifact(
        precision=opts.precision,
        source={"checkpoint": str(ckpt.resolve()), "sha256": src_hash},
        model=spec.to_dict(),
        vision=af.Graph(file="vision.onnx", **_io(out / "vision.onnx"),
                        attention="mha" if opts.attention == "gqa" else "masked"),
        decoder=af.Graph(file="decoder.onnx", **_io(out / "decoder.onnx"), attention=opts.attention,
                         select_on_device=opts.select_on_device, prefill_len=opts.prefill_len),
        kv=af.KVCache(layers=L, kv_heads=kvh, head_dim=d, cache_len=opts.cache_len, slots=opts.slots,
                      dtype="float16" if opts.precision == "fp16" else "float32"),
        image=af.ImageSpec(canvas=S, patch_size=v.patch_size, merge_size=v.spatial_merge_size, n_image_tokens=n_img,
                           mean=tuple(preprocess.MEAN), std=tuple(preprocess.STD), pad_value=opts.pad_value),
        tokens=af.Tokens(bos=tk.bos, eos=tk.eos, eod=tk.eod, pad=tk.pad, image=tk.image, im_start=tk.im_start,
                         im_end=tk.im_end, user=tk.user, system_sep=tk.system_sep, stop_ids=tuple(tk.stop_ids)),
        rope=af.Rope(layout=opts.rope_layout, theta=t.rope_theta, alpha=t.rope_alpha,
                     sections=tuple(t.rope_sections), head_dim=d),
        repetition_penalty=spec.repetition_penalty,
        tokenizer="tokenizer.json",
        files=_file_table(out),
        export={"opset": OPSET, "ir_version": IR_VERSION, "seconds": round(time.perf_counter() - t0, 1),
                "torch": torch.__version__},
    )
    af.write(out, m)
    total = sum(x["bytes"] for x in m.files.values())
    say(f"wrote {out} ({total / 2**20:.1f} MiB in {len(m.files)} files, {time.perf_counter() - t0:.1f} s)")
    return m


def reslot(src: Path, out: Path, slots: int) -> af.Artifact:
    """The same artifact with another slot count.  The decoder graph takes any batch (the `batch` axis), so
    only the manifest changes: graphs and tokenizer are hard-linked (copied across file systems).  TensorRT
    engines are not carried over (they are built for one slot)."""
    import os

    src, out = Path(src), Path(out)
    art = af.read(src)
    if not isinstance(slots, int) or not 1 <= slots <= 256:
        raise ValueError(f"slots must be an integer in 1..256, not {slots!r}")
    if out.resolve() == src.resolve():
        raise ValueError("OUT must differ from ARTIFACT")
    prepare_out(out)
    for name in art.files:
        dst = out / name
        if dst.exists():
            dst.unlink()
        try:
            os.link(src / name, dst)
        except OSError:
            shutil.copyfile(src / name, dst)
    new = art.derive(kv=replace(art.kv, slots=slots), source=dict(art.source, base_artifact=str(src.resolve())))
    af.write(out, new)
    return new
