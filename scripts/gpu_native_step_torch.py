"""The native decode step on a GPU with nothing but CUDA torch: no ONNX Runtime, no artifact.

    python scripts/gpu_native_step_torch.py --json OUT.json            on a CUDA machine
    python scripts/gpu_native_step_torch.py --weights int8 ...         the projections as 8-bit blocks
    python scripts/gpu_native_step_torch.py --cpu --json OUT.json      tiny sizes on the CPU: the numpy twins
                                                                       instead of the CUDA kernels (checks this
                                                                       script, and the twins' FP16 rounding
                                                                       against the reference)

The real decoder's sizes (quantize/realsize.py) on random FP16 weights, a KV cache filled to DEPTH rows (default
1,093, the eval page's prompt) for 1 and 8 slots.  The reference is the exported graph's own computation:
quantize/torch_model.py's Decoder (attention="gqa") and DeviceSelect, run eagerly by torch on the same weights and
caches.  The native step (edgeocr.backends.native_step: step_plan, CudaStep) runs on torch's buffers by address.
For each slot count it reports:
  - the logits' largest error relative to the reference's largest logit, whether the chosen tokens agree, and the
    error of the K/V rows the step wrote;
  - every kernel against its numpy twin on the same inputs (CudaStep.check), worst error per kernel kind;
  - the step's time: its CUDA graph replayed back to back, and one step as the runtime runs it (replay, then
    wait), in ms; the kernels per step; the weights' byte floor at --bandwidth-gbs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgeocr import rope  # noqa: E402
from edgeocr.backends import native_step as ns  # noqa: E402
from quantize.checkpoint import TextSpec  # noqa: E402

REAL = dict(vocab=120818, hidden=1024, inter=3584, layers=24, nq=16, kvh=8, head_dim=128)
TINY = dict(vocab=500, hidden=64, inter=128, layers=2, nq=4, kvh=2, head_dim=32)


class TorchBuf:
    """A torch tensor as the session's Buffer: address, shape, numpy dtype."""

    def __init__(self, t):
        self.t = t
        self.ptr = t.data_ptr()
        self.shape = tuple(t.shape)
        self.dtype = np.dtype(str(t.dtype).replace("torch.", ""))
        self.host = t.numpy() if t.device.type == "cpu" else None


class TorchMem:
    @staticmethod
    def read(buf: TorchBuf, out: np.ndarray) -> np.ndarray:
        out[...] = buf.t.detach().cpu().numpy().reshape(out.shape)
        return out


def weights(sz: dict, gen, torch, dev) -> dict[str, np.ndarray]:
    """HF-named FP16 weights ([out, in]) of a tied decoder, the scale of a trained model's (unit-variance
    activations), as numpy arrays."""
    H, inter, nq, kvh, d, V = (sz[k] for k in ("hidden", "inter", "nq", "kvh", "head_dim", "vocab"))

    def rnd(*shape, scale=None, mean=0.0):
        scale = scale if scale is not None else shape[-1] ** -0.5
        return (torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32) * scale + mean).half().cpu().numpy()

    w = {"model.embed_tokens.weight": rnd(V, H, scale=1.0), "model.norm.weight": rnd(H, scale=0.1, mean=1.0)}
    w["lm_head.weight"] = w["model.embed_tokens.weight"]
    for i in range(sz["layers"]):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": rnd(H, scale=0.1, mean=1.0),
                  p + "post_attention_layernorm.weight": rnd(H, scale=0.1, mean=1.0),
                  p + "self_attn.q_proj.weight": rnd(nq * d, H), p + "self_attn.k_proj.weight": rnd(kvh * d, H),
                  p + "self_attn.v_proj.weight": rnd(kvh * d, H), p + "self_attn.o_proj.weight": rnd(H, nq * d),
                  p + "self_attn.query_layernorm.weight": rnd(d, scale=0.1, mean=1.0),
                  p + "self_attn.key_layernorm.weight": rnd(d, scale=0.1, mean=1.0),
                  p + "mlp.gate_proj.weight": rnd(inter, H), p + "mlp.up_proj.weight": rnd(inter, H),
                  p + "mlp.down_proj.weight": rnd(H, inter)})
    return w


def native_tensors(w: dict, layers: int) -> dict[str, np.ndarray]:
    """The same weights in decoder_step.bin's layout (quantize/native_step.py): HF's [out, in] is the kernels'."""
    t = {"embed": w["model.embed_tokens.weight"], "norm": w["model.norm.weight"]}
    for i in range(layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        t[q + "qkv"] = np.concatenate([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        t[q + "o"] = w[p + "self_attn.o_proj.weight"]
        t[q + "gate_up"] = np.concatenate([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
        t[q + "down"] = w[p + "mlp.down_proj.weight"]
        t[q + "ln1"], t[q + "ln2"] = w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"]
        t[q + "qn"], t[q + "kn"] = w[p + "self_attn.query_layernorm.weight"], w[p + "self_attn.key_layernorm.weight"]
    return {k: np.ascontiguousarray(v) for k, v in t.items()}


def run(args, sz: dict, slots: int, torch, dev) -> dict:
    from quantize.torch_model import Decoder, DeviceSelect

    gen = torch.Generator(device=dev).manual_seed(slots)
    H, V, L, d = sz["hidden"], sz["vocab"], sz["layers"], sz["head_dim"]
    cache_len, depth = args.cache_len, args.depth
    t0 = time.perf_counter()
    w = weights(sz, gen, torch, dev)
    nt = native_tensors(w, L)
    if args.weights == "int8":           # 8-bit blocks; the reference gets the weights they stand for
        from quantize.native_step import PROJECTIONS, SCALES, quantize_rows
        for name in [t for t in nt if t.rsplit(".", 1)[-1] in PROJECTIONS]:
            nt[name], nt[name + SCALES] = quantize_rows(nt[name])
        deq = {k: ns.NumpyStep.deq(nt[k], nt[k + SCALES]).astype(np.float16) for k in nt
               if k.rsplit(".", 1)[-1] in PROJECTIONS}
        nq_d, kv_d, inter = sz["nq"] * d, sz["kvh"] * d, sz["inter"]
        for i in range(L):
            p, q = f"model.layers.{i}.", f"layers.{i}."
            qkv = deq[q + "qkv"]
            w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"], w[p + "self_attn.v_proj.weight"] = (
                qkv[:nq_d], qkv[nq_d:nq_d + kv_d], qkv[nq_d + kv_d:])
            w[p + "self_attn.o_proj.weight"] = deq[q + "o"]
            gate_up = deq[q + "gate_up"]
            w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = gate_up[:inter], gate_up[inter:]
            w[p + "mlp.down_proj.weight"] = deq[q + "down"]
    text = TextSpec(vocab_size=V, hidden_size=H, intermediate_size=sz["inter"], num_layers=L, num_heads=sz["nq"],
                    num_kv_heads=sz["kvh"], head_dim=d, rms_norm_eps=1e-5, rope_theta=10000.0, rope_alpha=1000.0,
                    rope_sections=(d // 8,) * 4, tie_word_embeddings=True, max_position_embeddings=cache_len)
    image_id = V - 1
    ref = DeviceSelect(Decoder(SimpleNamespace(text=text, tokens=SimpleNamespace(image=image_id)), w, cache_len,
                               dtype=torch.float16, attention="gqa")).to(dev).eval()
    dims = ns.Dims(layers=L, hidden=H, inter=sz["inter"], nq=sz["nq"], kvh=sz["kvh"], head_dim=d, vocab=V,
                   cache_len=cache_len, eps=1e-5, lm_head="embed", q8=args.weights == "int8")
    # the step's inputs: each slot's incoming token at row `depth` (a little different per slot)
    pos = np.array([depth - 3 * s for s in range(slots)], np.int64)
    ids = torch.randint(0, V - 1, (slots, 1), generator=gen, device=dev)
    cos_t, sin_t = rope.text_table(cache_len, rope.inv_freq(d, 10000.0, 1000.0))
    cos = torch.from_numpy(cos_t[pos][:, None]).to(dev)
    sin = torch.from_numpy(sin_t[pos][:, None]).to(dev)
    seen = (torch.rand(slots, V, generator=gen, device=dev) < 0.01).float()
    seen_ref = seen.clone()
    seen_ref[torch.arange(slots, device=dev), ids[:, 0]] = 1.0      # the incoming token joins the seen set
    penalty = torch.full((slots,), 1.08, device=dev)
    lens = torch.from_numpy(pos.astype(np.int32)).to(dev)
    kv = []
    for _ in range(2 * L):
        c = torch.zeros(slots, sz["kvh"], cache_len, d, device=dev, dtype=torch.float16)
        c[:, :, :depth] = torch.randn(slots, sz["kvh"], depth, d, generator=gen, device=dev).half()
        kv.append(c)
    with torch.no_grad():
        out = ref(ids, torch.zeros(1, H, device=dev, dtype=torch.float16), cos, sin, seen_ref, penalty, lens,
                  torch.tensor(cache_len, dtype=torch.int32), *kv)
    ref_logits, ref_next, ref_kv = out[0].float(), out[1], out[2:]
    build_s = time.perf_counter() - t0

    # the native step over torch buffers
    bufs = {f"w.{k}": TorchBuf(torch.from_numpy(v).to(dev)) for k, v in nt.items()}
    # the device state the runtime's step starts from: the incoming tokens in `next`, every slot live at its row;
    # ids, cos and sin are filled by the step itself (step_begin)
    bufs.update({"ids": TorchBuf(torch.zeros_like(ids)), "cos": TorchBuf(torch.zeros_like(cos)),
                 "sin": TorchBuf(torch.zeros_like(sin)), "lens": TorchBuf(lens.clone()),
                 "seen": TorchBuf(seen.clone()), "penalty": TorchBuf(penalty.clone()),
                 "logits": TorchBuf(torch.zeros(slots, V, device=dev)), "next": TorchBuf(ids[:, 0].clone()),
                 "live": TorchBuf(torch.ones(slots, dtype=torch.int32, device=dev)),
                 "table_cos": TorchBuf(torch.from_numpy(cos_t).to(dev)),
                 "table_sin": TorchBuf(torch.from_numpy(sin_t).to(dev))})
    for i in range(L):
        bufs[f"k.{i}"], bufs[f"v.{i}"] = TorchBuf(kv[i].clone()), TorchBuf(kv[L + i].clone())
    for name, (shape, dtype) in ns.scratch_shapes(dims, slots, np.float16).items():
        bufs[name] = TorchBuf(torch.zeros(shape, device=dev, dtype=getattr(torch, np.dtype(dtype).name)))
    props = torch.cuda.get_device_properties(dev) if dev.type == "cuda" else None
    sms = props.multi_processor_count if props else 1
    tc = args.gemv == "tensor-cores" and props is not None and props.major >= 8
    plan = ns.step_plan(dims, slots, sms, state=True, tensor_cores=tc)
    # programmatic dependent launch as the runtime decides it (sm_90 on, EDGEOCR_PDL)
    from edgeocr.backends import nvrtc
    pdl = props is not None and ns.pdl_enabled(nvrtc.device_arch()[0])
    res = {"slots": slots, "weights": args.weights, "depth": depth, "kernels_per_step": len(plan),
           "gemv": "tensor-cores" if tc else "cuda-cores", "pdl": pdl, "build_s": round(build_s, 1)}
    if dev.type == "cuda":
        step = ns.CudaStep(plan, {k: b.ptr for k, b in bufs.items()}, ns.kernel_defines(dims, slots, tc), graph=True,
                           pdl=pdl)
        step.capture()
        step.run()
    else:
        step = ns.NumpyStep(plan, {k: b.host for k, b in bufs.items()}, np.float16)
        step.run()
    got = bufs["logits"].t.float()
    scale = float(ref_logits.abs().max())
    res.update(rows_advanced=bool((bufs["lens"].t.cpu().numpy() == pos + 1).all()),
               seen_marked=bool(torch.equal(bufs["seen"].t, seen_ref)),
               logits_max_rel_err=float((got - ref_logits).abs().max()) / scale,
               tokens_agree=bool((bufs["next"].t == ref_next).all()),
               tokens=[int(x) for x in bufs["next"].t.tolist()], ref_tokens=[int(x) for x in ref_next.tolist()])
    kv_err = 0.0
    for i in range(L):
        for j, name in ((i, f"k.{i}"), (L + i, f"v.{i}")):
            a, b = bufs[name].t.float(), ref_kv[j].float()
            kv_err = max(kv_err, float((a - b).abs().max()) / max(float(b.abs().max()), 1e-6))
    res["kv_max_rel_err"] = kv_err
    if dev.type == "cuda":
        rows = step.check(plan, bufs, TorchMem(), np.float16)
        worst: dict[str, float] = {}
        for r in rows:
            worst[r["kernel"]] = max(worst.get(r["kernel"], 0.0), r.get("max_rel_err", float(r.get("mismatches", 0))))
        res["kernel_check_worst"] = worst
        res["kernel_check_bad"] = [r for r in rows if r.get("mismatches", 0) or r.get("max_rel_err", 0) > 2e-2
                                   or not r.get("finite", True)][:10]
        step.run()
        for _ in range(20):
            step.rt.graph_launch(step.exe, step.stream)
        step.rt.stream_sync(step.stream)
        t = time.perf_counter()
        for _ in range(args.replays):
            step.rt.graph_launch(step.exe, step.stream)
        step.rt.stream_sync(step.stream)
        res["step_ms_back_to_back"] = (time.perf_counter() - t) / args.replays * 1e3
        t = time.perf_counter()
        for _ in range(args.replays):
            step.run()
        res["step_ms_as_the_runtime_runs_it"] = (time.perf_counter() - t) / args.replays * 1e3
    weight_bytes = sum(v.nbytes for v in nt.values())
    live_kv = 2 * L * slots * sz["kvh"] * depth * d * 2
    res["weight_mib"] = round(weight_bytes / 2**20, 1)
    res["byte_floor_ms"] = round((weight_bytes + live_kv) / (args.bandwidth_gbs * 1e9) * 1e3, 4)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--depth", type=int, default=1093)
    ap.add_argument("--cache-len", type=int, default=4096)
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--bandwidth-gbs", type=float, default=4800.0)
    ap.add_argument("--cpu", action="store_true", help="tiny sizes, numpy twins, on the CPU")
    ap.add_argument("--weights", choices=["float", "int8"], default="float",
                    help="int8: the projections as 8-bit blocks (quantize native-step --weights int8)")
    ap.add_argument("--chunk", type=int, choices=[16, 32, 64], help="attention cache rows per block (default: the "
                    "runtime's, edgeocr.backends.native_step.CHUNK)")
    ap.add_argument("--gemv", choices=["tensor-cores", "cuda-cores"],
                    default="tensor-cores" if ns.TENSOR_CORES else "cuda-cores",
                    help="the GEMV kernels: decode_gemv_tc.cu's (sm_80 and later) or decode_gemv.cu's (default: the "
                    "runtime's, edgeocr.backends.native_step.TENSOR_CORES)")
    args = ap.parse_args(argv)
    if args.chunk:
        ns.CHUNK = args.chunk               # before any plan: the splits follow it
    import torch
    dev = torch.device("cpu" if args.cpu else "cuda")
    sz = TINY if args.cpu else REAL
    if args.cpu:
        args.depth, args.cache_len = min(args.depth, 100), min(args.cache_len, 256)
    out = {"device": "cpu" if args.cpu else torch.cuda.get_device_name(dev), "sizes": sz, "chunk": ns.CHUNK,
           "gemv": args.gemv,
           "runs": []}
    for slots in args.slots:
        r = run(args, sz, slots, torch, dev)
        out["runs"].append(r)
        print(json.dumps({k: v for k, v in r.items() if k not in ("tokens", "ref_tokens", "kernel_check_bad")}),
              flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    bad = [r for r in out["runs"] if not (r["tokens_agree"] and r["rows_advanced"] and r["seen_marked"])
           or r["logits_max_rel_err"] > 2e-2 or r.get("kernel_check_bad")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
