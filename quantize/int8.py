"""INT8 post-training quantization of an FP32 artifact with NNCF, as explicit Q/DQ ONNX.

Calibration inputs come from running the FP32 pipeline on document images preprocessed exactly like
the runtime: vision = the normalized canvases; decoder = prefill sequences of prompt + the FP32
model's own greedy continuation (teacher-forced), so image tokens, prompt tokens and generated text
tokens are all represented (a prefill over generated tokens computes the same hidden states the
decode steps do, without storing KV-cache snapshots).

Policy (TensorRT-compatible): symmetric activations (PERFORMANCE preset), SmoothQuant (TRANSFORMER
model type), per-channel symmetric INT8 weights stored as int8 initializers + DequantizeLinear; kept
in floating point: norms, softmax, RoPE (never quantized by NNCF), the patch-embedding conv, the
embedding gather, lm_head, and the attention matmuls (both operands activations).  A sensitivity pass
(NNCF accuracy control) reverts the most damaging layers until the held-out gate holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from edgeocr import artifact as af

log = logging.getLogger("edgeocr.quantize")


@dataclass(frozen=True)
class Int8Options:
    calib_images: int = 32          # images used for statistics
    holdout_images: int = 8         # further images for the accuracy gate (never used for statistics)
    decode_tokens: int = 128        # FP32 greedy tokens appended to each decoder calibration sequence: with 24,
                                    # activations deep into the answer went unseen and the demo model's INT8 lost
                                    # 1.7 CER points on eval (9.4 -> 11.1 %); 128 gives 9.7 % (docs/int8.md)
    vision_min_cosine: float = 0.98  # gate: mean cosine(INT8, FP32) of image embeddings
    decoder_min_top1: float = 0.90  # gate: teacher-forced top-1 agreement of decoder logits
    max_reverted: int = 64          # cap on layers the sensitivity pass may revert to floating point
    smooth_quant: bool = True


def _sha_dir(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


# ------------------------------------------------------------------------- graph analysis
def _initializer_names(model) -> set[str]:
    return {t.name for t in model.graph.initializer}


def eligible_and_excluded(model, kind: str) -> tuple[list[str], dict[str, str]]:
    """Weight MatMul/Gemm/Conv nodes NNCF may quantize, and the nodes kept FP with the reason."""
    inits = _initializer_names(model)
    consts = {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    eligible, excluded = [], {}
    for n in model.graph.node:
        if n.op_type not in ("MatMul", "Gemm", "Conv"):
            continue
        ins = list(n.input[:2])
        has_weight = any(i in inits or i in consts for i in ins)
        if not has_weight:
            excluded[n.name] = "attention matmul (both operands are activations)"
        elif kind == "vision" and n.op_type == "Conv" and len(_shape_of(model, ins[1])) == 4 \
                and _shape_of(model, ins[1])[1] == 3:
            excluded[n.name] = "patch embedding (RGB input conv)"
        elif kind == "decoder" and n.op_type == "MatMul" and ins[0] in inits and len(_shape_of(model, ins[0])) == 2 \
                and _shape_of(model, ins[0])[0] > 4 * _shape_of(model, ins[0])[1]:
            excluded[n.name] = "lm_head (tied embedding)"
        else:
            eligible.append(n.name)
    for n in model.graph.node:
        if n.op_type == "Gather" and any(i in inits for i in n.input[:1]):
            excluded[n.name] = "embedding gather"
    return eligible, excluded


def _shape_of(model, name: str) -> list[int]:
    for t in model.graph.initializer:
        if t.name == name:
            return list(t.dims)
    return []


def drop_output_nop_casts(model) -> int:
    """Remove Cast(to=FLOAT) nodes that produce a graph output of an FP32 graph (artifacts exported
    before the exporter stopped emitting them); NNCF's nop-cast pass fails on those."""
    from onnx import TensorProto

    outputs = {o.name for o in model.graph.output}
    producers = {o: n for n in model.graph.node for o in n.output}
    graph_inputs = {i.name for i in model.graph.input}
    removed = 0
    for n in list(model.graph.node):
        to = next((a.i for a in n.attribute if a.name == "to"), None)
        if n.op_type != "Cast" or to != TensorProto.FLOAT or n.output[0] not in outputs or n.input[0] in graph_inputs:
            continue
        src = producers.get(n.input[0])
        if src is None or any(n.input[0] in m.input for m in model.graph.node if m is not n):
            continue
        src.output[list(src.output).index(n.input[0])] = n.output[0]
        model.graph.node.remove(n)
        removed += 1
    return removed


def quantized_nodes(model) -> set[str]:
    """Compute nodes with a DequantizeLinear feeding them."""
    dq_out = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return {n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm", "Conv") and any(i in dq_out for i in n.input)}


def check_symmetric(model) -> None:
    """Every quantizer must have a zero point of 0: TensorRT accepts only symmetric INT8.
    (NNCF already stores the weights as int8 initializers feeding DequantizeLinear.)"""
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    bad = [n.name for n in model.graph.node
           if n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 2 and n.input[2] in inits
           and np.any(numpy_helper.to_array(inits[n.input[2]]) != 0)]
    if bad:
        raise ValueError(f"asymmetric quantizers (non-zero zero point) in {bad[:5]}: TensorRT needs symmetric")


def activation_quantizers_symmetric(model) -> tuple[int, int]:
    """(activation Q nodes, how many have zero point 0 and int8 type)."""
    from onnx import TensorProto, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    total = sym = 0
    for n in model.graph.node:
        if n.op_type != "QuantizeLinear" or n.input[0] in inits:
            continue
        total += 1
        if len(n.input) > 2 and n.input[2] in inits:
            zp = inits[n.input[2]]
            if zp.data_type == TensorProto.INT8 and not np.any(numpy_helper.to_array(zp)):
                sym += 1
    return total, sym


# ------------------------------------------------------------------------- calibration data
def capture(fp32_artifact: Path, images: list[Path], decode_tokens: int,
            progress: Callable[[str], None]) -> tuple[list[dict], list[dict]]:
    """Run the FP32 pipeline; return vision samples and decoder samples (ORT input dicts)."""
    from edgeocr.decode import DecodeOptions
    from edgeocr.model import OCRModel

    from edgeocr.backends.ort import available_providers
    device = "cuda" if "CUDAExecutionProvider" in available_providers() else "cpu"
    model = OCRModel(fp32_artifact, device=device)     # the FP32 pipeline; CUDA runs FP32 exactly (no TF32)
    m = model.artifact
    kv = m.kv
    zeros = np.zeros((1, *kv.shape[1:]), np.float32)   # one sequence's caches, shared, read-only
    vis, dec = [], []
    for i, p in enumerate(images):
        task = "spotting" if i % 2 == 0 else "structured_parse"
        res = model.recognize(p, task=task, options=DecodeOptions(max_new_tokens=decode_tokens))
        instruction, _ = model.instruction(task, None)
        ids = model.prompt_ids(instruction)
        cos_p, sin_p = model.rope_tables(ids)
        emb = np.array(model.session.image_embeds(), np.float32)   # the vision output of this image, [N_img, H]
        gen = np.asarray(res.token_ids, np.int64)
        seq = np.concatenate([ids, gen])
        pos = np.arange(len(ids), len(seq))
        cos = np.concatenate([cos_p, model.table_cos[pos]])
        sin = np.concatenate([sin_p, model.table_sin[pos]])
        vis.append({"pixels": model.prepare(p).pixels})
        sample = {"input_ids": seq[None], "image_embeds": emb, "cos": cos[None].astype(np.float32),
                  "sin": sin[None].astype(np.float32)}
        if m.decoder.attention == "gqa":
            sample["seqlens_k"] = np.array([len(seq) - 1], np.int32)
            sample["total_sequence_length"] = np.array(len(seq), np.int32)
        else:
            sample["past_len"] = np.zeros((1,), np.int64)
        if m.decoder.select_on_device:
            sample["seen"] = np.zeros((1, m.vocab_size), np.float32)
            sample["seen"][0, ids] = 1.0
            sample["penalty"] = np.asarray([m.repetition_penalty], np.float32)
        for layer in range(kv.layers):
            sample[f"past_key_{layer}"] = zeros
            sample[f"past_value_{layer}"] = zeros
        dec.append(sample)
        progress(f"calibration capture {i + 1}/{len(images)}: {p.name} ({len(ids)} prompt + {len(gen)} generated tokens)")
    return vis, dec


# ------------------------------------------------------------------------- metrics for the gate
def _session(model_proto_or_path, path_hint: Path | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if isinstance(model_proto_or_path, (str, Path)):
        return ort.InferenceSession(str(model_proto_or_path), so, providers=["CPUExecutionProvider"])
    if path_hint is not None:
        _materialize(model_proto_or_path, path_hint)
    return ort.InferenceSession(model_proto_or_path.SerializeToString(), so, providers=["CPUExecutionProvider"])


def vision_cosine(model, ref_outputs: list[np.ndarray], samples: list[dict], base: Path | None = None) -> float:
    s = _session(model, base)
    cos = []
    for x, ref in zip(samples, ref_outputs):
        out = s.run(None, x)[0]
        num = (out * ref).sum(-1)
        den = np.linalg.norm(out, axis=-1) * np.linalg.norm(ref, axis=-1) + 1e-12
        cos.append(float((num / den).mean()))
    return float(np.mean(cos))


def decoder_top1(model, ref_logits: list[np.ndarray], samples: list[dict], base: Path | None = None) -> float:
    """Teacher-forced top-1 agreement: one run per sample, comparing the last-position logits of
    every prefix would need S runs, so compare the argmax of the final logits of growing prefixes
    cut at the generated tokens."""
    s = _session(model, base)
    agree = []
    for x, refs in zip(samples, ref_logits):
        outs = _prefix_logits(s, x, len(refs))
        agree += [int(np.argmax(a) == np.argmax(b)) for a, b in zip(outs, refs)]
    return float(np.mean(agree))


def _prefix_logits(session, x: dict, n: int) -> list[np.ndarray]:
    """Logits of the last position of the n longest prefixes ending in generated tokens."""
    seq_len = x["input_ids"].shape[1]
    outs = []
    for cut in range(seq_len - n + 1, seq_len + 1):
        y = dict(x, input_ids=x["input_ids"][:, :cut], cos=x["cos"][:, :cut], sin=x["sin"][:, :cut])
        outs.append(session.run(["logits"], y)[0][0])
    return outs


# ------------------------------------------------------------------------- main entry
def quantize_graph(fp32_path: Path, kind: str, calib: list[dict], holdout: list[dict], opts: Int8Options,
                   progress: Callable[[str], None]):
    """NNCF PTQ (+ accuracy control when the gate fails).  Returns (model, report)."""
    import nncf
    import onnx
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters
    from nncf.onnx.quantization.backend_parameters import BackendParameters

    # weights stay on disk: NNCF reads them through EXTERNAL_DATA_DIR (graphs over 2 GB cannot be
    # serialized as one protobuf)
    model = onnx.load(str(fp32_path), load_external_data=False)
    drop_output_nop_casts(model)
    eligible, excluded = eligible_and_excluded(model, kind)
    adv = AdvancedQuantizationParameters(
        smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=0.95 if opts.smooth_quant else -1),
        backend_params={BackendParameters.EXTERNAL_DATA_DIR: str(fp32_path.parent.resolve())})
    common = dict(preset=nncf.QuantizationPreset.PERFORMANCE, model_type=nncf.ModelType.TRANSFORMER,
                  subset_size=len(calib), ignored_scope=nncf.IgnoredScope(names=sorted(excluded), validate=False),
                  advanced_parameters=adv)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):      # NNCF prints node names to stdout
        q = nncf.quantize(model, nncf.Dataset(calib), **common)
    progress(f"{kind}: PTQ done in {time.perf_counter() - t0:.0f} s")
    fp = _session(fp32_path)
    if kind == "vision":
        refs = [fp.run(None, x)[0] for x in holdout]
        score = vision_cosine(q, refs, holdout, fp32_path.parent)
        gate = opts.vision_min_cosine
        metric_name = "mean cosine vs FP32"
    else:
        n_gen = 8
        refs = [_prefix_logits(fp, x, n_gen) for x in holdout]
        score = decoder_top1(q, refs, holdout, fp32_path.parent)
        gate = opts.decoder_min_top1
        metric_name = "teacher-forced top-1 agreement vs FP32"
    progress(f"{kind}: held-out {metric_name} = {score:.4f} (gate {gate})")
    reverted: dict[str, str] = {}
    if score < gate and holdout and opts.max_reverted > 0:
        progress(f"{kind}: gate failed; sensitivity pass (NNCF accuracy control) reverts the most damaging layers")

        def validate(m, data):
            base = fp32_path.parent
            return (vision_cosine(m, refs, list(data), base) if kind == "vision"
                    else decoder_top1(m, refs, list(data), base))

        before = quantized_nodes(q)
        with contextlib.redirect_stdout(io.StringIO()):
            ac = {k: v for k, v in common.items() if k != "advanced_parameters"}
            q = nncf.quantize_with_accuracy_control(
                model, nncf.Dataset(calib), nncf.Dataset(holdout), validate, max_drop=1.0 - gate,
                drop_type=nncf.DropType.ABSOLUTE, **ac, advanced_quantization_parameters=adv,
                advanced_accuracy_restorer_parameters=_acc_params(opts))
        after = quantized_nodes(q)
        for name in sorted(before - after):
            reverted[name] = f"reverted by the sensitivity pass ({metric_name} gate {gate})"
        score = validate(q, holdout)
        progress(f"{kind}: after reverting {len(reverted)} layer(s): {metric_name} = {score:.4f}")
    _materialize(q, fp32_path.parent)
    check_symmetric(q)
    n_act, n_sym = activation_quantizers_symmetric(q)
    quantized = sorted(quantized_nodes(q))
    report = {"metric": metric_name, "score": score, "gate": gate, "gate_passed": score >= gate,
              "eligible": len(eligible), "quantized": len(quantized),
              "kept_fp": {**{k: v for k, v in excluded.items()}, **reverted},
              "activation_quantizers": n_act, "symmetric_activation_quantizers": n_sym}
    return q, report


def _materialize(model, base_dir: Path) -> None:
    """Load tensors that still point at the FP32 artifact's external data into the proto."""
    from onnx.external_data_helper import load_external_data_for_model, uses_external_data

    if any(uses_external_data(t) for t in model.graph.initializer):
        load_external_data_for_model(model, str(base_dir))


def _acc_params(opts: Int8Options):
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters
    return AdvancedAccuracyRestorerParameters(max_num_iterations=opts.max_reverted)


def store_large_fp32_as_fp16(model, min_bytes: int = 8 << 20, base_dir: Path | None = None) -> list[str]:
    """Store big FP32 weights kept out of INT8 (the tied embedding / lm_head: 472 MiB in the real model) as
    FP16 on disk, each followed by a Cast back to FP32, so the artifact shrinks while the graph's
    arithmetic stays FP32 (ONNX Runtime folds the Cast once at load).  Returns the converted names."""
    from onnx import TensorProto, external_data_helper, helper, numpy_helper

    done, keep, casts = [], [], []
    for init in model.graph.initializer:
        if init.data_type == TensorProto.FLOAT and int(np.prod(init.dims)) * 4 >= min_bytes:
            if external_data_helper.uses_external_data(init):
                if base_dir is None:
                    raise ValueError(f"{init.name} is stored externally; pass base_dir")
                external_data_helper.load_external_data_for_tensor(init, str(base_dir))
            arr = numpy_helper.to_array(init)
            half = numpy_helper.from_array(arr.astype(np.float16), init.name + "_fp16")
            keep.append(half)
            casts.append(helper.make_node("Cast", [half.name], [init.name], to=TensorProto.FLOAT,
                                          name=init.name + "_to_fp32"))
            done.append(init.name)
        else:
            keep.append(init)
    if done:
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)
        nodes = casts + list(model.graph.node)          # the casts first: topological order holds
        del model.graph.node[:]
        model.graph.node.extend(nodes)                  # (validated when saved: export._save checks the file)
    return done


def calibration_images(calib_dir: Path, opts: Int8Options) -> list[Path]:
    """The first calib_images + holdout_images image paths of `calib_dir`; ValueError when it has fewer."""
    from edgeocr.dataset import load_dir

    samples = load_dir(calib_dir)
    need = opts.calib_images + opts.holdout_images
    if len(samples) < need:
        raise ValueError(f"{calib_dir} has {len(samples)} images; {need} needed ({opts.calib_images} calibration "
                         f"+ {opts.holdout_images} held out: --calib-images, --holdout-images)")
    return [s.path for s in samples[:need]]


def build_int8(fp32_artifact: Path, calib_dir: Path, out: Path, opts: Int8Options = Int8Options(),
               progress: Callable[[str], None] | None = None) -> af.Artifact:
    """FP32 artifact + calibration images -> INT8 artifact (explicit Q/DQ)."""
    from quantize.export import _file_table, _save

    say = progress or (lambda s: log.info("%s", s))
    t0 = time.perf_counter()
    fp32_artifact, out = Path(fp32_artifact), Path(out)
    src = af.read(fp32_artifact)
    if src.precision != "fp32":
        raise ValueError(f"{fp32_artifact} is {src.precision}; INT8 calibration starts from an FP32 artifact")
    from quantize.export import prepare_out
    prepare_out(out, make=False)                      # before the calibration run, not after it
    paths = calibration_images(calib_dir, opts)
    vis, dec = capture(fp32_artifact, paths, opts.decode_tokens, say)
    c, h = opts.calib_images, opts.holdout_images
    prepare_out(out)
    reports = {}
    for kind, data in (("vision", vis), ("decoder", dec)):
        q, rep = quantize_graph(fp32_artifact / getattr(src, kind).file, kind, data[:c], data[c:c + h], opts, say)
        rep["stored_fp16"] = store_large_fp32_as_fp16(q, base_dir=fp32_artifact)
        if rep["stored_fp16"]:
            say(f"{kind}: {', '.join(rep['stored_fp16'])} stored as FP16 (computed in FP32)")
        _save(q, out / f"{kind}.onnx")
        reports[kind] = rep
        say(f"{kind}: {rep['quantized']}/{rep['eligible']} weight layers INT8, {len(rep['kept_fp'])} kept FP")
    shutil.copyfile(fp32_artifact / src.tokenizer, out / src.tokenizer)
    from quantize.export import _io
    m = src.derive(
        precision="int8", source=dict(src.source, fp32_artifact=str(fp32_artifact.resolve())),
        vision=replace(src.vision, **_io(out / src.vision.file)),
        decoder=replace(src.decoder, **_io(out / src.decoder.file)),
        files=_file_table(out),
        export=dict(src.export, int8={
            "tool": "nncf", "options": asdict(opts), "calibration_set": str(calib_dir),
            "calibration_sha256": _sha_dir(paths[:c]), "holdout_sha256": _sha_dir(paths[c:c + h]),
            "seconds": round(time.perf_counter() - t0, 1), "graphs": reports}))
    af.write(out, m)
    total = sum(v["bytes"] for v in m.files.values())
    say(f"wrote {out} ({total / 2**20:.1f} MiB, {time.perf_counter() - t0:.0f} s)")   # graphs checked by _save
    return m

