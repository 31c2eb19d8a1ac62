"""Measurements behind docs/perf.md, one subcommand each (every one writes JSON; see scripts/gpu_bench.sh):

    python scripts/gpu_perf.py probe --json OUT                    which fused ops ONNX Runtime's CUDA EP runs, checked
                                                                   against numpy (GroupQueryAttention's Q/K-norm
                                                                   prologue on packed q|k|v, uint8 antialiased Resize)
    python scripts/gpu_perf.py memory ARTIFACT --config C --json OUT   device memory by stage (context, each session, KV
                                                                   cache, first page, second page) with the runtime's
                                                                   settings (C = runtime) or edgeocr.ort_options' (C =
                                                                   conv: cuDNN settings; tuned: + shared arena +
                                                                   shrinkage; initializers: the runtime's, weights
                                                                   outside the arena); --pages N pages in turn
    python scripts/gpu_perf.py ttft ARTIFACT IMAGE --json OUT      time to first token from the encoded file for each
                                                                   preprocessing path (exact, fast, fast+device, device)
    python scripts/gpu_perf.py pack DIR OUT.json                   every *.json under DIR in one file
    python scripts/gpu_perf.py report summary.json                 the markdown tables of docs/perf.md from it

`memory` and the device paths of `ttft` reach into the ONNX Runtime session of edgeocr.backends.ort (its
sessions, its vision binding); each says so when that layout changed instead of reporting a wrong number.
--device cpu runs `memory` (host RSS) and `ttft` (host paths and the graph on the CPU) without a GPU.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _write(path, obj) -> None:
    Path(path).write_text(json.dumps(obj, indent=1, default=str))
    print(json.dumps(obj, default=str)[:2000])


# ------------------------------------------------------------------------------------------------ probe
def _session(model, providers):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=providers)


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def probe_gqa_qk_norm(providers, device="cuda", qk_norm: bool = True) -> dict:
    """Packed q|k|v into GroupQueryAttention with q_norm_weight / k_norm_weight, the cache bound in place as the
    runtime binds it: a 5-token prefill, then one decode step, against numpy (per-head RMSNorm, then causal
    grouped attention); the cache must hold the normalized keys.  qk_norm False: the same without the norm
    inputs (what ONNX Runtime's CPU provider runs; the tests check the probe itself with it)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    nq, kvh, d, mx, s, eps = 4, 2, 64, 32, 5, 1e-5
    rng = np.random.default_rng(1)
    qn, kn = (1 + 0.3 * rng.standard_normal(d)).astype(np.float16), (1 + 0.3 * rng.standard_normal(d)).astype(np.float16)
    norm_inputs = [""] * 7 + ["qn", "kn"] if qk_norm else []
    node = helper.make_node("GroupQueryAttention", ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total"]
                            + norm_inputs, ["out", "present_key", "present_value"], domain="com.microsoft",
                            num_heads=nq, kv_num_heads=kvh, **({"qk_norm_epsilon": eps} if qk_norm else {}))
    f16 = TensorProto.FLOAT16
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info("qkv", f16, [1, "s", (nq + 2 * kvh) * d]),
                           helper.make_tensor_value_info("past_key", f16, [1, kvh, mx, d]),
                           helper.make_tensor_value_info("past_value", f16, [1, kvh, mx, d]),
                           helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
                           helper.make_tensor_value_info("total", TensorProto.INT32, [])],
                          [helper.make_tensor_value_info("out", f16, None),
                           helper.make_tensor_value_info("present_key", f16, None),
                           helper.make_tensor_value_info("present_value", f16, None)],
                          initializer=[numpy_helper.from_array(qn, "qn"), numpy_helper.from_array(kn, "kn")]
                          if qk_norm else [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    sess = _session(m, providers)
    kc = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, kvh, mx, d), np.float16), device, 0)
    vc = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, kvh, mx, d), np.float16), device, 0)
    x = (rng.standard_normal((1, s + 1, (nq + 2 * kvh) * d)) * 2).astype(np.float16)
    outs = []
    for start, n in ((0, s), (s, 1)):
        b = sess.io_binding()
        b.bind_cpu_input("qkv", np.ascontiguousarray(x[:, start:start + n]))
        b.bind_ortvalue_input("past_key", kc)
        b.bind_ortvalue_input("past_value", vc)
        b.bind_cpu_input("seqlens_k", np.array([start + n - 1], np.int32))
        b.bind_cpu_input("total", np.array(start + n, np.int32))
        # get_outputs() lists the outputs in the order they were bound: "out" first
        b.bind_output("out", "cpu")
        b.bind_ortvalue_output("present_key", kc)
        b.bind_ortvalue_output("present_value", vc)
        sess.run_with_iobinding(b)
        out = b.get_outputs()[0].numpy()
        if out.shape != (1, n, nq * d):
            raise AssertionError(f"GroupQueryAttention output has shape {out.shape}, expected {(1, n, nq * d)}")
        outs.append(out.astype(np.float32))
    xf = x.astype(np.float32)[0]
    q, k = xf[:, :nq * d].reshape(-1, nq, d), xf[:, nq * d:(nq + kvh) * d].reshape(-1, kvh, d)
    if qk_norm:
        q, k = _rms(q, qn.astype(np.float32), eps), _rms(k, kn.astype(np.float32), eps)
    v = xf[:, (nq + kvh) * d:].reshape(-1, kvh, d)
    ref = np.zeros((s + 1, nq, d), np.float32)
    for t in range(s + 1):
        for h in range(nq):
            kv = h // (nq // kvh)
            sc = k[:t + 1, kv] @ q[t, h] / np.sqrt(d)
            p = np.exp(sc - sc.max())
            ref[t, h] = (p / p.sum()) @ v[:t + 1, kv]
    ours = np.concatenate([outs[0][0], outs[1][0]]).reshape(s + 1, nq, d)
    cache = kc.numpy()[0, :, :s + 1].astype(np.float32).transpose(1, 0, 2)
    err, cerr = float(np.abs(ours - ref).max()), float(np.abs(cache - k).max())
    return {"max_err": err, "cache_err": cerr, "ok": bool(err < 3e-2 and cerr < 3e-2), "providers": sess.get_providers()}


def probe_resize(device) -> dict:
    """The preprocessing graph on `device` against Pillow's letterbox and against itself on the CPU."""
    from edgeocr import preprocess
    from edgeocr.preprocess_graph import DevicePreprocessor

    img = preprocess.load_image(ROOT / "calibration_data" / "eval" / "000000.jpg")
    a = np.asarray(img)
    exact = preprocess.normalize(preprocess.letterbox(img)[0])
    ours = DevicePreprocessor(device=device)(a)[0].numpy()
    cpu = DevicePreprocessor(device="cpu")(a)[0].numpy()
    level = 1 / (255 * min(preprocess.STD))
    return {"max_levels_vs_pillow": float(np.abs(ours - exact).max() / level),
            "fraction_differing_vs_pillow": float((ours != exact).mean()),
            "identical_to_cpu_graph": bool(np.array_equal(ours, cpu)), "ok": bool(np.abs(ours - exact).max() < 3 * level)}


def cmd_probe(a) -> int:
    # CPU second: ONNX Runtime places shape inputs there; neither probed op has a CPU kernel to fall back to
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if a.device == "cuda" else ["CPUExecutionProvider"]
    out = {"device": a.device}
    for name, fn in (("gqa_qk_norm", lambda: probe_gqa_qk_norm(providers, a.device)),
                     ("resize_uint8", lambda: probe_resize(a.device))):
        try:
            out[name] = fn()
        except Exception as e:  # an unsupported op is a result here, not a failure of the probe
            out[name] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
    flags = [f for f, k in (("--no-gqa-qk-norm", "gqa_qk_norm"),) if not out[k]["ok"]]
    out["fuse_flags"] = " ".join(flags)
    _write(a.json, out)
    print(f"FUSE_FLAGS={out['fuse_flags']}")
    return 0


# ------------------------------------------------------------------------------------------------ memory
def _used_mib(cuda) -> float:
    if cuda is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    free, total = cuda.mem_info()
    return (total - free) / 2**20


def _smi_mib(device_id: int = 0) -> dict | None:
    """nvidia-smi's view: the whole device's used memory and this process's own (its CUDA context and
    allocations, what other processes and the driver's reservations are not), in MiB; None where nvidia-smi is
    missing or answers with anything but numbers (a process it does not list: "process" None)."""
    import os
    import subprocess

    def query(*args) -> list[list[str]]:
        out = subprocess.run(["nvidia-smi", "-i", str(device_id), *args, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode != 0:
            raise ValueError(out.stderr.strip() or out.stdout.strip())
        return [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]

    try:
        used = float(query("--query-gpu=memory.used")[0][0])
        own = [float(row[1]) for row in query("--query-compute-apps=pid,used_memory")
               if len(row) == 2 and row[0] == str(os.getpid())]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return {"device_used": used, "process": own[0] if own else None}


def tuned_arena(manifest, config: str, device: str) -> tuple[bool, bool, str]:
    """(share one arena between the sessions, shrink the arena after each vision call, why) for `config`.

    Never both when the decoder replays a CUDA graph (gqa + selection in the graph, on CUDA): the captured step
    holds the addresses of its intermediate buffers, which lie in the arena as free chunks between steps.  With
    one shared arena, the vision call's shrinkage hands those chunks back to the device (cudaFree), and the
    next replay reads freed memory: `cudaGraphLaunch ... invalid argument`, then an illegal memory access (what
    `memory --config tuned` did on both fused artifacts).  There the vision arena is shrunk on its own and the
    decoder keeps its arena."""
    if config != "tuned" or device != "cuda":
        return False, False, "off"
    graph = manifest.decoder.attention == "gqa" and manifest.decoder.select_on_device
    if graph:
        return False, True, "separate arenas: the decoder replays a CUDA graph (vision arena shrunk after each call)"
    return True, True, "one shared arena, shrunk after each vision call"


def cmd_memory(a) -> int:
    """Device memory in use (total - free, the whole device) after each stage of loading and running."""
    import onnxruntime as ort

    from edgeocr import ort_options
    from edgeocr.decode import DecodeOptions
    from edgeocr.artifact import read as read_manifest

    cuda = None
    smi = {}                    # stage -> nvidia-smi's device and per-process figures (CUDA only)
    if a.device == "cuda":
        smi["before this process touched CUDA"] = _smi_mib()
        from edgeocr.backends import cudart
        cuda = cudart.load()
    stages = [("process + CUDA context", _used_mib(cuda))]

    def mark(stage: str) -> None:
        stages.append((stage, _used_mib(cuda)))
        if cuda is not None:
            smi[stage] = _smi_mib()

    if cuda is not None:
        smi[stages[0][0]] = _smi_mib()
    notes = {}
    stack = ort_options.cuda_stack_bytes()
    if cuda is not None:
        notes["stack_limit_default"] = cuda.stack_limit()
        if stack is not None:             # what the session sets at load, set here first to see it on its own
            cuda.set_stack_limit(stack)
            mark(f"CUDA stack limit {stack} B")
    m = read_manifest(Path(a.artifact))
    original = ort.InferenceSession.__init__
    original_run = ort.InferenceSession.run_with_iobinding
    share, shrink_vision, notes["arena"] = tuned_arena(m, a.config, a.device)
    shrink = ort_options.vision_run_options(ort) if shrink_vision else None

    def init(self, path, sess_options=None, providers=None, **kw):
        name = Path(str(path)).stem
        if a.config in ("conv", "tuned") and providers:
            providers = [(p[0], {**p[1], **ort_options.cuda_provider_options(m.precision, conv_workspace=False)})
                         if isinstance(p, tuple) and p[0] == "CUDAExecutionProvider" else p for p in providers]
        if a.config == "initializers":      # the weights cudaMalloc'ed on their own, outside the arena
            sess_options = sess_options or ort.SessionOptions()
            sess_options.add_session_config_entry("session.use_device_allocator_for_initializers", "1")
        if share:
            sess_options = sess_options or ort.SessionOptions()
            try:
                ort_options.share_arena(ort, sess_options)
                notes["shared_arena"] = "on"
            except Exception as e:      # this ONNX Runtime cannot share a CUDA arena: measured without it
                notes["shared_arena"] = f"unavailable: {type(e).__name__}: {str(e)[:200]}"
        original(self, path, sess_options, providers, **kw)
        self._edgeocr_graph = name
        mark(f"{name} session")

    def run_with_iobinding(self, binding, run_options=None):
        if shrink is not None and run_options is None and getattr(self, "_edgeocr_graph", "") == "vision":
            run_options = shrink
        return original_run(self, binding, run_options)

    ort.InferenceSession.__init__ = init
    ort.InferenceSession.run_with_iobinding = run_with_iobinding
    from edgeocr.model import OCRModel
    t = time.perf_counter()
    model = OCRModel(a.artifact, device=a.device)
    mark("KV cache + step buffers (model ready)")
    o = DecodeOptions(max_new_tokens=a.tokens, ignore_stop=True, tail_repetition_stop=False)
    runs = []
    for k in range(a.pages):
        r = model.recognize(a.image[k % len(a.image)], task="spotting", options=o)
        runs.append({k2: round(v, 3) for k2, v in r.timings_ms.items()})
        mark(f"after page {k + 1} ({a.tokens} tokens)")
    files = m.files
    weights = {g: sum(v["bytes"] for f, v in files.items() if f.startswith(getattr(m, g).file)) / 2**20
               for g in ("vision", "decoder")}
    kv = model.session.memory_bytes()["kv_cache"] / 2**20
    notes["runtime_arena"] = getattr(model.session, "arena", "?")
    if cuda is not None:                  # the driver grows the limit for a kernel that needs more
        notes["stack_limit_after"] = cuda.stack_limit()
    notes["graphs"] = {"prefill": getattr(model.session, "prefill_graph", False),
                       "vision": getattr(model.session, "vision_graph", False)}
    deltas = [(n, round(u, 1), round(u - (stages[i - 1][1] if i else 0), 1)) for i, (n, u) in enumerate(stages)]
    _write(a.json, {"artifact": a.artifact, "precision": m.precision, "config": a.config, "device": a.device,
                    "fusion": m.export.get("fusion", {}).get("target"), "stages_mib": deltas,
                    "weight_files_mib": weights, "kv_cache_mib": kv, "peak_mib": max(u for _, u in stages),
                    "timings_ms": runs, "seconds": round(time.perf_counter() - t, 1), "notes": notes,
                    "nvidia_smi_mib": smi,
                    "provider_options": ort_options.cuda_provider_options(m.precision)
                    if a.config not in ("runtime", "initializers") else "runtime"})
    return 0


# ------------------------------------------------------------------------------------------------ ttft
def cmd_ttft(a) -> int:
    """Encoded file -> first token, per preprocessing path; median of `repeats` after one warm-up each."""
    from edgeocr import preprocess
    from edgeocr.model import OCRModel
    from edgeocr.preprocess_graph import DevicePreprocessor

    model = OCRModel(a.artifact, device=a.device)
    s = model.session
    select = s.selection()                        # the artifact's token selection (edgeocr.selection)
    canvas, pad = model.image_spec.canvas, model.image_spec.pad_value
    dev = DevicePreprocessor(device=a.device, canvas=canvas, pad_value=pad)
    penalty = model.artifact.repetition_penalty
    instruction = model.instruction("spotting", None)[0]

    def exact(path):
        c, _ = preprocess.letterbox(preprocess.load_image(path), canvas, pad)
        return preprocess.normalize(c)

    def fast(path):
        c, _ = preprocess.letterbox_fast(*preprocess.load_image_for_canvas(path, canvas), canvas=canvas, pad_value=pad)
        return preprocess.normalize(c)

    def fast_device(path):                        # host: draft decode + OpenCV resize; device: pad + normalize
        img, size = preprocess.load_image_for_canvas(path, canvas)
        c, lb = preprocess.letterbox_fast(img, size, canvas, pad)
        return dev(np.ascontiguousarray(c[:lb.new_h, :lb.new_w]), size)[0]

    def device(path):                             # host: decode; device: resize + pad + normalize
        return dev(np.asarray(preprocess.load_image(path)))[0]

    def first_token(pixels) -> int:
        if a.device == "cpu" and not isinstance(pixels, np.ndarray):
            pixels = pixels.numpy()                 # the CPU session takes host arrays only
        s.encode_image(pixels)                    # host array, or device pixels (an OrtValue)
        ids = model.prompt_ids(instruction)
        cos, sin = model.rope_tables(ids)
        return select.first(0, ids, penalty, cos, sin)

    out = {"artifact": a.artifact, "image": a.image, "device": a.device, "precision": model.artifact.precision,
           "fusion": model.artifact.export.get("fusion", {}).get("target"), "paths": {}}
    ref_tok = None
    for name, fn in (("exact", exact), ("fast", fast), ("fast_device", fast_device), ("device", device)):
        try:
            times, toks, pre = [], [], []
            for k in range(a.repeats + 1):
                t0 = time.perf_counter()
                px = fn(a.image)
                t1 = time.perf_counter()
                toks.append(first_token(px))
                t2 = time.perf_counter()
                if k:
                    times.append((t2 - t0) * 1e3)
                    pre.append((t1 - t0) * 1e3)
            ref_tok = toks[0] if ref_tok is None else ref_tok
            out["paths"][name] = {"ttft_ms": statistics.median(times), "ttft_min_ms": min(times),
                                  "preprocess_ms": statistics.median(pre), "first_token": toks[0],
                                  "same_first_token_as_exact": toks[0] == ref_tok}
        except Exception as e:
            out["paths"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}", "trace": traceback.format_exc()[-600:]}
    _write(a.json, out)
    return 0


def cmd_pack(a) -> int:
    packed = {}
    for p in sorted(Path(a.dir).glob("*.json")):
        try:
            packed[p.stem] = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            packed[p.stem] = {"error": f"unreadable: {e}"}
    Path(a.out).write_text(json.dumps(packed, indent=1))
    print(f"packed {len(packed)} results into {a.out} ({Path(a.out).stat().st_size / 1024:.0f} KiB)")
    return 0


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def cmd_report(a) -> int:
    """summary.json (gpu_bench.sh) -> the markdown tables docs/perf.md shows."""
    d = json.loads(Path(a.summary).read_text())
    f = lambda x, n=3: "" if x is None else f"{x:.{n}f}"   # noqa: E731
    out = ["| flavour | prompt tokens | decode ms/token | TTFT ms from the file (path) | TTFT ms from pixels | vision ms |"
           " prefill ms | device MiB | transformers ms/token |", "|---|---|---|---|---|---|---|---|---|"]
    for name in ("fp16", "fp16_fused", "fp16_fused_state", "w8", "w8_fused"):
        b = d.get(f"bench_{name}")
        if b:
            e, hf = b["edgeocr"], b.get("transformers") or {}
            out.append(_row([name, e["prompt_tokens"], f(e["decode_ms_per_token"]),
                             f"{f(e['first_token_ms'], 1)} ({e.get('preprocess') or 'exact'})",
                             f(e["first_token_ms"] - e["preprocess_ms"], 1), f(e["vision_ms"], 1),
                             f(e["prefill_ms"], 1), f(e["peak_device_mib"], 0), f(hf.get("decode_ms_per_token"))]))
    if "nodes" in d:
        out += ["", "decoder nodes with a kernel (exported -> fused): "
                f"{d['nodes']['decoder_nodes_exported']} -> {d['nodes']['decoder_nodes_fused']}"
                + (f", with step state {d['nodes']['decoder_nodes_step_state']}"
                   if "decoder_nodes_step_state" in d["nodes"] else "")]
    out += ["", "| flavour | stage | kernels | GPU busy ms | wall ms | memcpy | host->device |", "|---|---|---|---|---|---|---|"]
    for k in sorted(x for x in d if x.startswith("profile_")):
        for s in d[k].get("stages", []):
            out.append(_row([k[8:], s["stage"], f(s["kernels"], 0), f(s["gpu_busy_ms"]), f(s["wall_ms"]),
                             f(s["memcpy"], 0), f(s.get("h2d"), 0)]))
    out += ["", "| artifact / settings | " + " | ".join(n for n, _, _ in next(
        (v["stages_mib"] for k, v in d.items() if k.startswith("memory_") and "stages_mib" in v), [])) + " | peak |"]
    out.append("|---" * (len(out[-1].split("|")) - 2) + "|")
    for k in sorted(x for x in d if x.startswith("memory_") and "stages_mib" in d[x]):
        v = d[k]
        out.append(_row([k[7:]] + [f"{delta:+.0f}" for _, _, delta in v["stages_mib"]] + [f(v["peak_mib"], 0)]))
    out += ["", "| artifact | path | TTFT ms (median) | host part ms | same first token |", "|---|---|---|---|---|"]
    for k in sorted(x for x in d if x.startswith("ttft_")):
        for path, v in d[k]["paths"].items():
            out.append(_row([k[5:], path, f(v.get("ttft_ms"), 1), f(v.get("preprocess_ms"), 1),
                             v.get("same_first_token_as_exact", v.get("error", ""))]))
    if "probe" in d:
        out += ["", "probe: " + json.dumps({k: v.get("ok") for k, v in d["probe"].items() if isinstance(v, dict)})]
    if "tokens" in d:
        out += ["tokens vs unfused FP16 (first divergence per page): " + json.dumps(
            {Path(k).name: v["first_divergence"] for k, v in d["tokens"].items()})]
    print("\n".join(out))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--json", required=True)
    m = sub.add_parser("memory")
    m.add_argument("artifact")
    m.add_argument("--config", choices=["runtime", "conv", "tuned", "initializers"], default="runtime")
    m.add_argument("--image", nargs="+", default=[str(ROOT / "calibration_data" / "eval" / "000000.jpg")],
                   help="page images, read in turn (default: one eval page)")
    m.add_argument("--tokens", type=int, default=64)
    m.add_argument("--pages", type=int, default=2, help="pages read one after another (default 2)")
    m.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    m.add_argument("--json", required=True)
    t = sub.add_parser("ttft")
    t.add_argument("artifact")
    t.add_argument("image")
    t.add_argument("--repeats", type=int, default=5)
    t.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    t.add_argument("--json", required=True)
    k = sub.add_parser("pack")
    k.add_argument("dir")
    k.add_argument("out")
    r = sub.add_parser("report")
    r.add_argument("summary")
    a = ap.parse_args(argv)
    return {"probe": cmd_probe, "memory": cmd_memory, "ttft": cmd_ttft, "pack": cmd_pack, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
