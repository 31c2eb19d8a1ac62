"""The preprocessing paths against the exact (Pillow) one on the held-out eval pages, with the shipped demo model:
pixel levels, image embeddings and greedy tokens, plus host timings of each path.

    python scripts/preprocess_parity.py [--pages N] [--tokens 64] [--upscale 3.3] --json OUT

Paths: fast (JPEG draft decoding + OpenCV resize on the host), graph (edgeocr.preprocess_graph on ONNX Runtime's
CPU provider: the computation the GPU runs).  --upscale also re-encodes every page enlarged (a 300-dpi-like scan)
so that draft decoding and area resampling are exercised.  Each path's canvas is fed to the model as an already
fitted 1024x1024 image, so only the pixels differ.
"""

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed(fn, n=3):
    fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def main() -> int:
    from PIL import Image

    from edgeocr import preprocess
    from edgeocr.dataset import load_dir
    from edgeocr.decode import DecodeOptions
    from edgeocr.model import OCRModel
    from edgeocr.preprocess_graph import DevicePreprocessor
    from quantize.export import ExportOptions, export

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=0, help="first N eval pages (default all)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--upscale", type=float, default=0.0, help="also pages enlarged by this factor, as JPEG")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    pages = load_dir(ROOT / "calibration_data" / "eval")
    pages = pages[:a.pages] if a.pages else pages
    with tempfile.TemporaryDirectory() as tmp:
        export(ROOT / "demo_model", Path(tmp) / "demo", ExportOptions(cache_len=1536, prefill_len=1280))
        model = OCRModel(Path(tmp) / "demo")
        graph = DevicePreprocessor(device="cpu")
        o = DecodeOptions(max_new_tokens=a.tokens, ignore_stop=True)
        rows = []
        sources = [(p.path.name, p.path.read_bytes()) for p in pages]
        if a.upscale:
            for name, data in list(sources):
                img = preprocess.decode_bytes(data)
                big = img.resize((round(img.width * a.upscale), round(img.height * a.upscale)), Image.BICUBIC)
                buf = io.BytesIO()
                big.save(buf, "JPEG", quality=92)
                sources.append((f"{name} x{a.upscale}", buf.getvalue()))
        for name, data in sources:
            exact, lb = preprocess.letterbox(preprocess.load_image(data))
            fast, _ = preprocess.letterbox_fast(*preprocess.load_image_for_canvas(data))
            px = graph(np.asarray(preprocess.load_image(data)))[0].numpy()
            canvas_graph = np.rint(px[0] * np.asarray(preprocess.STD)[:, None, None] * 255
                                   + np.asarray(preprocess.MEAN)[:, None, None] * 255).clip(0, 255).astype(np.uint8)
            canvases = {"exact": exact, "fast": fast, "graph": canvas_graph.transpose(1, 2, 0)}
            emb = {}
            for k, c in canvases.items():
                model.session.encode_image(preprocess.normalize(c))
                emb[k] = model.session.image_embeds()
            toks = {k: model.recognize(c, task="structured_parse", options=o).token_ids for k, c in canvases.items()}
            row = {"page": name, "size": [lb.width, lb.height], "draft_decoded":
                   preprocess.load_image_for_canvas(data)[0].size != (lb.width, lb.height)}
            reg = (slice(0, lb.new_h), slice(0, lb.new_w))
            for k in ("fast", "graph"):
                d = np.abs(canvases[k][reg].astype(np.int16) - exact[reg]).astype(np.float32)
                row[k] = {"levels_mean": float(d.mean()), "levels_p99": float(np.percentile(d, 99)),
                          "levels_max": float(d.max()), "values_differing": float((d > 0).mean()),
                          "embed_max_abs": float(np.abs(emb[k] - emb["exact"]).max()),
                          "embed_rel": float(np.abs(emb[k] - emb["exact"]).max() / emb["exact"].std()),
                          "tokens_identical": toks[k] == toks["exact"],
                          "first_divergence": next((i for i, (x, y) in enumerate(zip(toks[k], toks["exact"]))
                                                    if x != y), None)}
            row["host_ms"] = {
                "exact": timed(lambda: preprocess.normalize(preprocess.letterbox(preprocess.load_image(data))[0])),
                "fast": timed(lambda: preprocess.normalize(preprocess.letterbox_fast(
                    *preprocess.load_image_for_canvas(data))[0])),
                "decode_only": timed(lambda: np.asarray(preprocess.load_image(data))),
                "graph_cpu": timed(lambda: graph(np.asarray(preprocess.load_image(data))))}
            rows.append(row)
            print(name, {k: (row[k]["levels_mean"], row[k]["tokens_identical"]) for k in ("fast", "graph")},
                  row["host_ms"], flush=True)
    summary = {}
    for k in ("fast", "graph"):
        for group, rs in (("pages", [r for r in rows if "x" not in r["page"].split()[-1]]),
                          ("upscaled", [r for r in rows if " x" in r["page"]])):
            if not rs:
                continue
            summary[f"{k}_{group}"] = {
                "n": len(rs), "tokens_identical": sum(r[k]["tokens_identical"] for r in rs),
                "levels_mean": statistics.mean(r[k]["levels_mean"] for r in rs),
                "levels_p99_max": max(r[k]["levels_p99"] for r in rs),
                "levels_max": max(r[k]["levels_max"] for r in rs),
                "values_differing_max": max(r[k]["values_differing"] for r in rs),
                "embed_rel_max": max(r[k]["embed_rel"] for r in rs),
                "embed_rel_median": statistics.median(r[k]["embed_rel"] for r in rs)}
    for group in ("pages", "upscaled"):
        rs = [r for r in rows if (" x" in r["page"]) == (group == "upscaled")]
        if rs:
            summary[f"host_ms_{group}"] = {k: statistics.median(r["host_ms"][k] for r in rs) for k in rs[0]["host_ms"]}
    Path(a.json).write_text(json.dumps({"tokens": a.tokens, "summary": summary, "pages": rows}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
