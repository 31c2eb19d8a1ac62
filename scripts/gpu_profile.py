"""Where the GPU time goes (issue 7): CUDA kernels of the vision encoder, the prefill and the decode steps of
an artifact on ONNX Runtime CUDA, captured process-wide with CUPTI (torch.profiler), grouped by kernel.

    python scripts/gpu_profile.py ARTIFACT [--steps 64] [--cuda-graph]

Per stage: wall time, GPU busy time (sum of kernel durations), kernel count, and the top kernels.  A decode
step whose busy time is far below its wall time is bound by launches/gaps, not by the kernels.
"""
import argparse
import time
from collections import defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from edgeocr.cli import _synthetic_page
from edgeocr.model import OCRModel


def kernels(prof):
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out.append((e.name, e.device_time))   # microseconds
    return out


def report(stage, ks, wall_ms, per=1):
    busy = sum(d for _, d in ks) / 1e3
    by = defaultdict(lambda: [0, 0.0])
    for n, d in ks:
        by[n][0] += 1
        by[n][1] += d / 1e3
    print(f"== {stage}: wall {wall_ms / per:.3f} ms, GPU busy {busy / per:.3f} ms, {len(ks) / per:.0f} kernels"
          + (f" (per step, {per} steps)" if per > 1 else ""))
    for n, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"   {t / per:8.3f} ms {c / per:6.1f}x  {n[:110]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("artifact")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--cuda-graph", action="store_true")
    a = ap.parse_args()
    m = OCRModel(a.artifact, device="cuda", cuda_graph=a.cuda_graph)
    s = m.session
    prep = m.prepare(_synthetic_page())
    ids = m.prompt_ids(m.instruction("spotting", None)[0])
    cos, sin = m.rope_tables(ids)

    penalty = m.manifest.decode.get("repetition_penalty", 1.08)

    def begin():                                    # once per request, outside the profiles
        if s.selects:
            s.begin(ids, penalty)

    def decode(n):
        tok = s.first_token if s.selects else 1
        for k in range(n):
            pos = len(ids) + k
            tok = s.step_token(tok, pos, m.table_cos[pos], m.table_sin[pos]) if s.selects else \
                int(np.argmax(s.step(tok, pos, m.table_cos[pos], m.table_sin[pos])))

    def profiled(fn):
        """(CUDA kernels, wall ms) of fn()."""
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t) * 1e3
        return kernels(p), wall

    s.encode_image(prep.pixels, fetch=False)        # warm-up (and graph capture)
    begin()
    s.prefill(ids, cos, sin)
    decode(8)
    torch.cuda.synchronize()
    report("vision", *profiled(lambda: s.encode_image(prep.pixels, fetch=False)))
    begin()
    report(f"prefill ({len(ids)} tokens)", *profiled(lambda: s.prefill(ids, cos, sin)))
    ks, wall = profiled(lambda: decode(a.steps))
    report("decode", ks, wall, per=a.steps)


if __name__ == "__main__":
    main()
