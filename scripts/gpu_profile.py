"""Where the GPU time goes: CUDA kernels of the vision encoder, the prefill and the decode steps of an artifact on
ONNX Runtime CUDA, captured process-wide with CUPTI (torch.profiler), grouped by kernel.

    python scripts/gpu_profile.py ARTIFACT [--steps 64] [--cuda-graph] [--json OUT.json] [--label NAME]
                                  [--sequence N] [--live N]
    python scripts/gpu_profile.py ARTIFACT --admission N [--image PAGE] [--json OUT.json]
    python scripts/gpu_profile.py ARTIFACT --device cpu [--json OUT.json]     # ORT node counts, no CUDA needed

Per stage: wall time, GPU busy time (sum of kernel durations), kernel count, and the top kernels.  A decode
step whose busy time is far below its wall time is bound by launches/gaps, not by the kernels.  With
--device cpu (no GPU, e.g. to check a tiny artifact) each stage reports the nodes ONNX Runtime's CPU provider
runs after its own graph optimizations (one kernel call each).

--admission N: N one-token calls of the runtime's own path (`OCRModel.recognize`, as `edgeocr bench` times the
first token), each laid out on the GPU's timeline: the host's first token from pixels (admission to the first
token, less the device letterbox) beside the GPU's span over the same call (first to last kernel or copy after the
letterbox), its busy time, and the idle gaps inside the span with the CUDA calls the host made during each; what
the host adds to the first token is the gap between the two.
"""
import argparse
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

TOP = 12


def _summary(stage: str, ks: list[tuple[str, float]], wall_ms: float, per: int = 1, sequence: int = 0) -> dict:
    """ks: (kernel name, duration us) in launch order over `per` repetitions of the stage; `sequence`: also keep
    the first that many kernels in order (name, us), to tell which graph node each kernel runs."""
    by = defaultdict(lambda: [0, 0.0])
    for n, d in ks:
        by[n][0] += 1
        by[n][1] += d / 1e3
    top = sorted(by.items(), key=lambda kv: -kv[1][1])[:TOP]
    return {"stage": stage, "repetitions": per, "wall_ms": wall_ms / per,
            "gpu_busy_ms": sum(d for _, d in ks) / 1e3 / per, "kernels": len(ks) / per,
            "memcpy": sum(1 for n, _ in ks if n.startswith("Memcpy") or "memcpy" in n) / per,
            "h2d": sum(1 for n, _ in ks if "HtoD" in n) / per,         # host -> device copies inside the stage
            "top": [{"ms": t / per, "count": c / per, "kernel": n[:160]} for n, (c, t) in top],
            **({"sequence": [[n[:120], round(d, 2)] for n, d in ks[:sequence]]} if sequence else {})}


def _print(s: dict) -> None:
    per = s["repetitions"]
    print(f"== {s['stage']}: wall {s['wall_ms']:.3f} ms, GPU busy {s['gpu_busy_ms']:.3f} ms, {s['kernels']:.0f} kernels"
          + (f" (per step, {per} steps)" if per > 1 else ""))
    for k in s["top"]:
        print(f"   {k['ms']:8.3f} ms {k['count']:6.1f}x  {k['kernel'][:110]}")


def profile_cuda(artifact: str, steps: int, cuda_graph: bool, sequence: int = 0, live_slots: int = 1) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from edgeocr.bench import synthetic_page
    from edgeocr.model import OCRModel

    m = OCRModel(artifact, device="cuda", cuda_graph=cuda_graph)
    s = m.session
    prep = m.prepare(synthetic_page())
    ids = m.prompt_ids(m.instruction("spotting", None)[0])
    cos, sin = m.rope_tables(ids)
    penalty = m.artifact.repetition_penalty
    n = s.slots
    toks, pos, live = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
    if not 1 <= live_slots <= n:
        raise SystemExit(f"--live {live_slots}: this artifact has {n} slots")
    live[:live_slots] = True                        # the same page in the first live_slots slots (the others idle)
    nxt = np.zeros(n, np.int64)

    select = s.selection()                          # the artifact's token selection (edgeocr.selection)

    def prefill(slot: int = 0):
        toks[slot] = select.first(slot, ids, penalty, cos, sin)

    def decode(steps):
        for k in range(steps):
            pos[live] = len(ids) + k
            c, si = m.table_cos[pos], m.table_sin[pos]
            toks[live] = select.next(toks, pos, c, si, live, nxt)[live]

    def profiled(fn):
        """(CUDA kernels [(name, us)], wall ms) of fn()."""
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t) * 1e3
        ev = sorted((e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
        return [(e.name, e.device_time) for e in ev], wall

    pixels = m.preparer.pixels(prep)                # what the vision graph takes (on CUDA: letterboxed on the GPU)
    for _ in range(3):                              # warm-up: the vision and prefill CUDA graphs (where on) are
        s.encode_image(pixels)                      # captured on their third run, so the profiled runs replay them
        prefill()
    for slot in range(1, live_slots):
        prefill(slot)
    decode(8)
    torch.cuda.synchronize()
    out = [_summary("vision", *profiled(lambda: s.encode_image(pixels)), sequence=sequence)]
    out.append(_summary(f"prefill ({len(ids)} tokens)", *profiled(prefill), sequence=sequence))
    ks, wall = profiled(lambda: decode(steps))
    out.append(_summary(f"decode ({live_slots} of {n} slots live)" if n > 1 else "decode", ks, wall, per=steps,
                        sequence=min(sequence, len(ks) // max(steps, 1))))
    return out


GAP_US = 20.0          # idle gaps on the GPU's timeline worth naming (--admission)


def _admission(call: dict, kernels: list, api: list, top: int = 6) -> dict:
    """One call's GPU timeline: kernels/copies [(start us, end us, name)] sorted by start, from the letterbox's
    last kernel on (the call's from-pixels part); api: the host's CUDA calls [(start us, end us, name)]."""
    span_end, gaps = None, []
    for (_, e0, n0), (s1, _, n1) in zip(kernels, kernels[1:]):
        span_end = e0 if span_end is None else max(span_end, e0)
        if s1 - span_end > GAP_US:
            during = Counter(n for a0, a1, n in api if a1 > span_end and a0 < s1)
            gaps.append({"us": round(s1 - span_end, 1), "after": n0[:80], "before": n1[:80],
                         "host_calls": dict(during.most_common(4))})
    merged = []                              # busy time: the union of the intervals (streams may overlap)
    for s0, e0, _ in kernels:
        if merged and s0 <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e0)
        else:
            merged.append([s0, e0])
    busy = sum(e - s for s, e in merged)
    span = (max(e for _, e, _ in kernels) - kernels[0][0]) if kernels else 0.0
    return {**call, "gpu_span_ms": span / 1e3, "gpu_busy_ms": busy / 1e3, "gpu_idle_ms": (span - busy) / 1e3,
            "kernels": len(kernels), "gaps": sorted(gaps, key=lambda g: -g["us"])[:top]}


def profile_admission(artifact: str, calls: int, image=None) -> list[dict]:
    """`calls` one-token calls of the runtime's path, each on the GPU's timeline (see --admission)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from edgeocr.bench import default_preprocess, synthetic_page
    from edgeocr.decode import DecodeOptions
    from edgeocr.model import OCRModel

    m = OCRModel(artifact, device="cuda", preprocess=default_preprocess("cuda"))
    page = image or synthetic_page()
    one = DecodeOptions(max_new_tokens=1, ignore_stop=True)
    for _ in range(4):                              # the vision and prefill CUDA graphs captured, then replayed
        m.recognize(page, options=one)
    torch.cuda.synchronize()
    marks = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            r = m.recognize(page, options=one)
            torch.cuda.synchronize()
            marks.append(r.timings_ms)
    evs = list(p.events())
    cuda = sorted(((e.time_range.start, e.time_range.end, e.name) for e in evs
                   if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda k: k[0])
    api = sorted(((e.time_range.start, e.time_range.end, e.name) for e in evs
                  if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith(("cuda", "cu"))),
                 key=lambda k: k[0])
    # calls are told apart by the GPU's idle time between them (each ends with a synchronize and host work)
    groups, end = [], None
    for k in cuda:
        if end is None or k[0] - end > 2000.0:                   # 2 ms of nothing: the next call
            groups.append([])
            end = k[1]
        groups[-1].append(k)
        end = max(end, k[1])
    if len(groups) != calls:
        raise SystemExit(f"--admission: found {len(groups)} bursts of GPU work for {calls} calls; cannot attribute")
    out = []
    for t, g in zip(marks, groups):
        lb = [i for i, k in enumerate(g) if "letterbox" in k[2]]   # letterbox_pass, letterbox_canvas
        start = lb[-1] + 1 if lb else 0              # after the letterbox: the part from pixels
        call = {"from_pixels_ms": t["first_token"] - t.get("letterbox", 0.0), "vision_ms": t["vision"],
                "prefill_ms": t["prefill"], "letterbox_ms": t.get("letterbox", 0.0)}
        out.append(_admission(call, g[start:], api))
    return out


def profile_cpu(artifact: str) -> list[dict]:
    """Nodes ONNX Runtime's CPU provider runs per vision call and per decoder call, after its optimizations."""
    import onnx
    import onnxruntime as ort

    from edgeocr.artifact import read as read_manifest

    m = read_manifest(Path(artifact))
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for stage, graph in (("vision", "vision"), ("decode (per step, all nodes)", "decoder")):
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            so.optimized_model_filepath = str(Path(tmp) / f"{graph}.onnx")
            so.log_severity_level = 3
            ort.InferenceSession(str(Path(artifact) / getattr(m, graph).file), so, providers=["CPUExecutionProvider"])
            nodes = Counter(n.op_type for n in onnx.load(so.optimized_model_filepath, load_external_data=False).graph.node)
            out.append({"stage": stage, "repetitions": 1, "wall_ms": 0.0, "gpu_busy_ms": 0.0,
                        "kernels": sum(nodes.values()), "memcpy": 0, "h2d": 0,
                        "top": [{"ms": 0.0, "count": c, "kernel": op} for op, c in nodes.most_common(TOP)]})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifact")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--cuda-graph", action="store_true")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--json", help="also write the summary here")
    ap.add_argument("--label", default="", help="name of this artifact in the JSON")
    ap.add_argument("--live", type=int, default=1, metavar="N",
                    help="slots decoding during the profiled steps (the same page in each; default 1)")
    ap.add_argument("--sequence", type=int, default=0, metavar="N",
                    help="keep each stage's first N kernels in launch order in the JSON (the decode: its first step)")
    ap.add_argument("--admission", type=int, default=0, metavar="N",
                    help="instead: N one-token calls of the runtime's path on the GPU's timeline (host vs GPU)")
    ap.add_argument("--image", help="--admission: this page (default: a synthetic one)")
    a = ap.parse_args()
    if a.admission:
        calls = profile_admission(a.artifact, a.admission, a.image)
        print(f"##### {a.label or a.artifact}: admission, {len(calls)} one-token calls")
        for c in calls:
            print(f"   from pixels {c['from_pixels_ms']:.3f} ms (vision {c['vision_ms']:.3f}, prefill "
                  f"{c['prefill_ms']:.3f}); GPU span {c['gpu_span_ms']:.3f}, busy {c['gpu_busy_ms']:.3f}, idle "
                  f"{c['gpu_idle_ms']:.3f}; host beyond the GPU span {c['from_pixels_ms'] - c['gpu_span_ms']:.3f}")
            for gp in c["gaps"][:3]:
                print(f"      gap {gp['us']:.0f} us after {gp['after'][:50]} before {gp['before'][:50]}: "
                      f"{gp['host_calls']}")
        if a.json:
            Path(a.json).write_text(json.dumps({"label": a.label, "artifact": a.artifact, "admission": calls},
                                               indent=1))
        return 0
    stages = (profile_cuda(a.artifact, a.steps, a.cuda_graph, a.sequence, a.live) if a.device == "cuda"
              else profile_cpu(a.artifact))
    print(f"##### {a.label or a.artifact}")
    for s in stages:
        _print(s)
    if a.json:
        Path(a.json).write_text(json.dumps({"label": a.label, "artifact": a.artifact, "device": a.device,
                                            "cuda_graph": a.cuda_graph, "stages": stages}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
