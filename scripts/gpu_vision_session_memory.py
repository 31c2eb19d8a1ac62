"""Where a vision graph's ONNX Runtime session takes its device memory at load: for each artifact, a fresh process
loads the vision graph alone on CUDA (the runtime's provider options, the CUDA context's stack at 0) under each
graph optimization level, and reports the device memory the session took, the ops and initializer bytes of the
graph ONNX Runtime optimized (saved with `optimized_model_filepath`), so that two fusions can be compared.

    python scripts/gpu_vision_session_memory.py ART1 ART2 ... --json out.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LEVELS = ("all", "extended", "basic", "disabled")


def _child(artifact: str, level: str) -> dict:
    import numpy as np
    import onnx
    import onnxruntime as ort

    from edgeocr import ort_options
    from edgeocr.artifact import read as read_manifest
    from edgeocr.backends import cudart

    cu = cudart.load()
    cu.make_current()
    cu.set_stack_limit(0)
    free0, total = cu.mem_info()
    m = read_manifest(Path(artifact))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                   "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[level]
    tmp = Path(tempfile.mkdtemp())
    so.optimized_model_filepath = str(tmp / "optimized.onnx")
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.onnx.data")
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    prov = [("CUDAExecutionProvider", ort_options.cuda_provider_options(m.precision)), "CPUExecutionProvider"]
    sess = ort.InferenceSession(str(Path(artifact) / m.vision.file), so, providers=prov)
    free1, _ = cu.mem_info()
    g = onnx.load(str(tmp / "optimized.onnx"))
    init_bytes = sum(int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
                     for t in g.graph.initializer)
    out = {"artifact": artifact, "level": level, "session_mib": round((free0 - free1) / 2**20, 1),
           "ops": dict(Counter(n.op_type for n in g.graph.node).most_common()),
           "initializers": len(g.graph.initializer), "initializer_mib": round(init_bytes / 2**20, 1)}
    feed = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape],
                             np.float16 if "float16" in i.type else np.float32) for i in sess.get_inputs()}
    sess.run(None, feed)
    free2, _ = cu.mem_info()
    out["after_one_run_mib"] = round((free0 - free2) / 2**20, 1)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifacts", nargs="*")
    ap.add_argument("--levels", default=",".join(LEVELS))
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=2, metavar=("ARTIFACT", "LEVEL"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(_child(*a.child)))
        return 0
    rows = []
    for art in a.artifacts:
        for level in a.levels.split(","):
            p = subprocess.run([sys.executable, __file__, "--child", art, level], capture_output=True, text=True,
                               timeout=300)
            row = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else \
                {"artifact": art, "level": level, "error": p.stderr[-1500:]}
            print(json.dumps({k: v for k, v in row.items() if k != "ops"}))
            rows.append(row)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
