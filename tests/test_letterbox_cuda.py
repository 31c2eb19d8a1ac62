"""The CUDA letterbox kernels' numpy twin against Pillow (the exact path), bit for bit, and the kernels compiling
for the GPUs the runtime targets (NVRTC runs without a GPU).  On a GPU: tests/test_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from edgeocr import preprocess
from edgeocr.errors import BackendError, ImageError
from edgeocr.letterbox_cuda import letterbox_twin, passes, pillow_picks_order, resample_coeffs, resize_twin

# page-like sizes (portrait and landscape pages, scans to shrink 3.5x, small images to enlarge, a tall strip
# whose height shrinks far more than its width, one edge already at the canvas size) and odd ones
SIZES = [(721, 1081), (1081, 721), (2400, 3600), (500, 900), (300, 2000), (195, 2639), (1024, 700), (700, 1024),
         (3000, 40), (64, 64), (1023, 1025), (1600, 1200), (17, 5)]


def _page(w, h, seed):
    """Text-like: paper, dark strokes and a gradient (random noise alone would not exercise clipping much)."""
    rng = np.random.default_rng(seed)
    a = np.full((h, w, 3), 235, np.uint8)
    a[rng.random((h, w)) < 0.08] = rng.integers(0, 60, 3, dtype=np.uint8)
    a = a.astype(np.int16) + np.linspace(-20, 20, w, dtype=np.int16)[None, :, None]
    return np.clip(a, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("w,h", SIZES)
def test_the_twin_is_the_exact_path_bit_for_bit(w, h):
    rgb = _page(w, h, w * 7 + h)
    canvas, lb = preprocess.letterbox(Image.fromarray(rgb))
    got, lb2 = letterbox_twin(rgb)
    assert lb2 == lb
    assert got.dtype == np.float32 and got.shape == (1, 3, 1024, 1024)
    np.testing.assert_array_equal(got, preprocess.normalize(canvas))


def test_the_twin_is_pillows_resize_in_any_direction():
    rng = np.random.default_rng(5)
    for _ in range(40):
        w, h = (int(v) for v in rng.integers(8, 1400, 2))
        nw, nh = (int(v) for v in rng.integers(4, 1100, 2))
        rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)           # noise: the filter's negative lobes clip
        want = np.asarray(Image.fromarray(rgb).resize((nw, nh), Image.BICUBIC))
        np.testing.assert_array_equal(resize_twin(rgb, nw, nh), want, err_msg=f"{w}x{h} -> {nw}x{nh}")


def test_the_pass_order_is_the_installed_pillows():
    """Pillow 13 runs the vertical pass first where the height shrinks by more than twice as many pixels as the
    width, earlier releases never: the probe tells which, and the other order gives other pixels."""
    picks = pillow_picks_order()
    assert picks == (int(Image.__version__.split(".")[0]) >= 13)
    rgb = np.random.default_rng(1).integers(0, 256, (2000, 300, 3), dtype=np.uint8)
    want = np.asarray(Image.fromarray(rgb).resize((154, 1024), Image.BICUBIC))
    np.testing.assert_array_equal(resize_twin(rgb, 154, 1024), want)
    assert not np.array_equal(resize_twin(rgb, 154, 1024, pick_order=not picks), want)
    first = passes(300, 2000, 154, 1024)[0]
    assert first[0] == (not picks)                     # horizontal first unless Pillow picks the vertical one


def test_weights_are_pillows_fixed_point():
    bounds, k = resample_coeffs(1081, 1024)            # shrinking a little: 2 * ceil(2 * 1.056) + 1 taps
    assert k.dtype == np.int32 and k.shape == (1024, 7) and bounds.shape == (1024, 2)
    assert np.abs(k.sum(axis=1) - (1 << 22)).max() <= 4      # each row sums to one, to the rounding of its taps
    assert bounds[0, 0] == 0 and (bounds[:, 0] + bounds[:, 1]).max() == 1081
    bounds, k = resample_coeffs(700, 700)              # the identity: one weight of 1.0 per pixel
    assert (k.max(axis=1) == 1 << 22).all() and (k.sum(axis=1) == 1 << 22).all()
    with pytest.raises(ImageError):
        resample_coeffs(0, 10)


@pytest.mark.parametrize("arch", ["sm_75", "sm_87", "sm_89", "sm_90"])
def test_the_kernels_compile_for_orin_ada_and_hopper(arch):
    from edgeocr.backends import nvrtc
    from edgeocr.letterbox_cuda import SOURCE
    cubin = nvrtc.compile_cubin(SOURCE.read_text(), arch, name="letterbox.cu")
    assert b"letterbox_pass" in cubin and b"letterbox_canvas" in cubin


def test_the_device_strategy_refuses_an_unknown_letterbox_engine(monkeypatch):
    from edgeocr.artifact import ImageSpec
    from edgeocr.prepare import DevicePreparer
    spec = ImageSpec(canvas=1024, patch_size=16, merge_size=2, n_image_tokens=1056, mean=preprocess.MEAN,
                     std=preprocess.STD, pad_value=255)
    monkeypatch.setenv("EDGEOCR_LETTERBOX", "opencv")
    with pytest.raises(BackendError, match="EDGEOCR_LETTERBOX"):
        DevicePreparer(spec, "cpu")
    monkeypatch.setenv("EDGEOCR_LETTERBOX", "kernels")
    prep = DevicePreparer(spec, "cpu")          # the kernels are CUDA's; the CPU runs the graph
    assert prep.engine == "graph"
