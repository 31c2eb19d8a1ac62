"""The host part of the device path's first token, on this machine's CPU: one encoded page decoded into the
[H, W, 3] uint8 array the letterbox kernels upload, by Pillow (decode, then its copy out as a numpy array) and by
simplejpeg (libjpeg-turbo straight into a numpy array), and the page's ink check; medians of --repeats, and
whether both decoders give the same pixels.

    python scripts/host_decode_bench.py calibration_data/eval/000000.jpg --repeats 30 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgeocr import preprocess  # noqa: E402


def _median_ms(fn, repeats: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeats + 1):                       # the first call warms the file cache and the libraries
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(times[1:]), 3), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("image")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    data, name = preprocess.read_bytes(a.image)
    res = {"image": a.image, "bytes": len(data)}
    res["read_ms"], _ = _median_ms(lambda: preprocess.read_bytes(a.image), a.repeats)
    res["pillow_decode_ms"], img = _median_ms(lambda: preprocess.decode_bytes(data, name), a.repeats)
    res["pillow_to_numpy_ms"], ref = _median_ms(lambda: np.asarray(img), a.repeats)
    res["size"] = list(img.size)
    try:
        import simplejpeg
        res["simplejpeg"] = simplejpeg.__version__
        res["simplejpeg_decode_ms"], got = _median_ms(lambda: preprocess.decode_jpeg_array(data, name), a.repeats)
        res["same_pixels"] = got is not None and bool(np.array_equal(got[0], ref))
    except ImportError:
        res["simplejpeg"] = None
    res["ink_check_pillow_image_ms"], _ = _median_ms(lambda: preprocess.is_blank(img), a.repeats)
    res["ink_check_array_ms"], _ = _median_ms(lambda: preprocess.is_blank(ref), a.repeats)
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
