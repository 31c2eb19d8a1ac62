"""The vision graph's output with ONNX Runtime's attention kernels chosen by environment variables, against its
default choice, on one page (CUDA provider; each side in a process of its own, since ONNX Runtime reads these
variables once per process):

    python scripts/vision_kernels_agree.py ARTIFACT IMAGE OUT.json [VAR=VALUE ...]

OUT.json: the largest absolute difference, the cosine similarity over all values and the worst per-token cosine
of image_embeds.  Used by scripts/gpu_vision_attention.sh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CHILD = "EDGEOCR_AGREE_OUT"


def embeds(artifact: str, image: str) -> np.ndarray:
    import onnxruntime as ort

    from edgeocr.artifact import read
    from edgeocr.ort_options import cuda_provider_options
    from edgeocr.preprocess import letterbox, load_image, normalize

    art = read(Path(artifact))
    canvas, _ = letterbox(load_image(image).convert("RGB"), art.image.canvas)
    providers = [("CUDAExecutionProvider", cuda_provider_options(art.precision)), "CPUExecutionProvider"]
    sess = ort.InferenceSession(str(Path(artifact) / art.vision.file), providers=providers)
    if sess.get_providers()[0] != "CUDAExecutionProvider":
        raise SystemExit(f"the CUDA provider did not load: {sess.get_providers()}")
    return sess.run(["image_embeds"], {"pixels": normalize(canvas)})[0].astype(np.float32)


def side(artifact: str, image: str, env: dict[str, str], path: str) -> np.ndarray:
    subprocess.run([sys.executable, __file__, artifact, image, path], env={**os.environ, **env, CHILD: path},
                   check=True)
    return np.load(path)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__)
        return 2
    artifact, image, out, *assign = argv
    if os.environ.get(CHILD):
        np.save(os.environ[CHILD], embeds(artifact, image))
        return 0
    bad = [a for a in assign if "=" not in a]
    if bad:
        raise SystemExit(f"expected VAR=VALUE, not {bad[0]!r}")
    env = dict(a.split("=", 1) for a in assign)
    with tempfile.TemporaryDirectory() as tmp:
        ref = side(artifact, image, {}, f"{tmp}/ref.npy")
        got = side(artifact, image, env, f"{tmp}/got.npy")
    a, b = ref.reshape(-1, ref.shape[-1]), got.reshape(-1, got.shape[-1])
    cos = lambda x, y: float((x * y).sum() / (np.linalg.norm(x) * np.linalg.norm(y) + 1e-30))  # noqa: E731
    rows = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-30)
    report = {"env": env, "shape": list(ref.shape), "max_abs_diff": float(np.abs(a - b).max()),
              "ref_max_abs": float(np.abs(a).max()), "cosine": cos(a, b), "worst_token_cosine": float(rows.min())}
    Path(out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
