"""The device path's JPEG decode (preprocess.decode_jpeg_array, simplejpeg): Pillow's pixels exactly, every
refusal from the header as before, and Pillow's decode (and its error messages) for whatever simplejpeg does not
take."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import simplejpeg                   # a dev dependency (scripts/setup.sh); the [cuda] extra's on a GPU machine
from PIL import Image

from edgeocr import preprocess
from edgeocr.artifact import ImageSpec
from edgeocr.errors import BackendError, ImageError, ImageTooLarge, PageTooSmall
from edgeocr.prepare import open_preparer

EVAL = Path(__file__).resolve().parents[1] / "calibration_data" / "eval"

SPEC = ImageSpec(canvas=1024, patch_size=16, merge_size=2, n_image_tokens=1056, mean=preprocess.MEAN,
                 std=preprocess.STD, pad_value=255)


def _jpeg(a: np.ndarray, **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "JPEG", **save)
    return buf.getvalue()


def _page(h=300, w=220, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = np.full((h, w, 3), 245, np.uint8)
    a[40:260:12, 20:200] = rng.integers(0, 90, (19, 180, 3))          # lines of "ink"
    return a


def _pillow(data: bytes) -> np.ndarray:
    return np.asarray(preprocess.decode_bytes(data))


def _variants() -> dict[str, bytes]:
    page = _page()
    return {"4:2:0": _jpeg(page, quality=90), "4:4:4": _jpeg(page, quality=95, subsampling=0),
            "4:2:2": _jpeg(page, quality=80, subsampling=1), "progressive": _jpeg(page, progressive=True),
            "grayscale": _jpeg(page[..., 0]), "odd size": _jpeg(_page(301, 219)),
            "restart markers": _jpeg(page, restart_marker_blocks=4)}


@pytest.mark.parametrize("kind", list(_variants()))
def test_same_pixels_as_pillow(kind):
    data = _variants()[kind]
    got = preprocess.decode_jpeg_array(data, kind)
    assert got is not None, kind
    rgb, size = got
    ref = _pillow(data)
    assert size == (ref.shape[1], ref.shape[0]) and rgb.dtype == np.uint8 and rgb.shape == ref.shape
    assert np.array_equal(rgb, ref)


def test_same_pixels_as_pillow_on_the_shipped_pages():
    files = sorted(EVAL.glob("*.jpg"))[:12]
    assert len(files) == 12
    for f in files:
        data = f.read_bytes()
        rgb, _ = preprocess.decode_jpeg_array(data, f.name)
        assert np.array_equal(rgb, _pillow(data)), f


def test_what_simplejpeg_does_not_take_goes_to_pillow():
    cmyk = io.BytesIO()
    Image.fromarray(_page()).convert("CMYK").save(cmyk, "JPEG")
    png = io.BytesIO()
    Image.fromarray(_page()).save(png, "PNG")
    truncated = _variants()["4:2:0"][:1500]
    for data in (cmyk.getvalue(), png.getvalue(), truncated, b"\xff\xd8\xff not a jpeg at all"):
        assert preprocess.decode_jpeg_array(data) is None


def test_the_header_is_checked_before_decoding(monkeypatch):
    def no_decode(*a, **k):
        raise AssertionError("decoded a page its header refuses")

    monkeypatch.setattr(simplejpeg, "decode_jpeg", no_decode)
    with pytest.raises(ImageTooLarge, match="exceeds the pixel limit of 1,000"):
        preprocess.decode_jpeg_array(_variants()["4:2:0"], "big.jpg", max_pixels=1000)
    with pytest.raises(PageTooSmall, match="tiny.jpg"):
        preprocess.decode_jpeg_array(_jpeg(np.zeros((8, 40, 3), np.uint8)), "tiny.jpg")


def test_edgeocr_jpeg_setting_is_read_at_load(monkeypatch):
    """EDGEOCR_JPEG picks the decoder when the preparer is made; a bad value, or simplejpeg asked for where it is
    not installed, fails there (a settings error), not as an image error on every page."""
    monkeypatch.setenv(preprocess.JPEG_ENV, " Pillow ")
    assert preprocess.jpeg_decoder() == "pillow"
    monkeypatch.setenv(preprocess.JPEG_ENV, "simplejpeg")
    assert preprocess.jpeg_decoder() == "simplejpeg"
    monkeypatch.delenv(preprocess.JPEG_ENV)
    assert preprocess.jpeg_decoder() == "simplejpeg"
    monkeypatch.setenv(preprocess.JPEG_ENV, "turbo")
    with pytest.raises(BackendError, match="EDGEOCR_JPEG='turbo'"):
        open_preparer("device", SPEC, device="cpu")
    monkeypatch.setenv(preprocess.JPEG_ENV, "simplejpeg")
    monkeypatch.setitem(__import__("sys").modules, "simplejpeg", None)          # not installed
    with pytest.raises(BackendError, match="simplejpeg is not installed"):
        open_preparer("device", SPEC, device="cpu")
    monkeypatch.delenv(preprocess.JPEG_ENV)
    assert open_preparer("device", SPEC, device="cpu").jpeg == "pillow"


def test_device_preparer_decodes_jpegs_with_simplejpeg(monkeypatch, tmp_path):
    """The device preparer (here on the CPU, its graph engine): a JPEG file, its bytes and ImageBytes are decoded
    by simplejpeg, a PNG by Pillow; the pixels, the letterbox and the ink check are those of the Pillow path;
    a corrupt JPEG gets Pillow's message."""
    calls = []
    real = simplejpeg.decode_jpeg
    monkeypatch.setattr(simplejpeg, "decode_jpeg", lambda *a, **k: calls.append(1) or real(*a, **k))
    data = _variants()["4:4:4"]
    path = tmp_path / "page.jpg"
    path.write_bytes(data)
    monkeypatch.setenv(preprocess.JPEG_ENV, "pillow")
    ref = open_preparer("device", SPEC, device="cpu")(data)
    assert not calls
    monkeypatch.delenv(preprocess.JPEG_ENV)
    prep = open_preparer("device", SPEC, device="cpu")
    assert prep.jpeg == "simplejpeg"
    for src in (path, str(path), data, bytearray(data), preprocess.ImageBytes(data, 10**6, "upload.jpg")):
        p = prep(src)
        assert isinstance(p.pixels, np.ndarray) and np.array_equal(p.pixels, ref.pixels)
        assert p.letterbox == ref.letterbox and p.blank == ref.blank is False
    assert len(calls) == 5
    png, cmyk = io.BytesIO(), io.BytesIO()
    Image.fromarray(_page()).save(png, "PNG")
    Image.fromarray(_page()).convert("CMYK").save(cmyk, "JPEG")
    assert np.array_equal(prep(png.getvalue()).pixels, _page()) and len(calls) == 5
    got = prep(cmyk.getvalue()).pixels                                  # Pillow's CMYK -> RGB
    assert len(calls) == 5 and np.array_equal(got, np.asarray(preprocess.decode_bytes(cmyk.getvalue())))
    with pytest.raises(ImageError, match="truncated or corrupt"):
        prep(data[:1500])
    with pytest.raises(ImageTooLarge, match="upload.jpg"):
        prep(preprocess.ImageBytes(data, 1000, "upload.jpg"))
    blank = prep(_jpeg(np.full((200, 150, 3), 250, np.uint8)))
    assert blank.blank is True


def test_doctor_names_the_jpeg_decoder(monkeypatch, capsys):
    """`edgeocr doctor` says which library decodes the device path's JPEGs, and fails a bad EDGEOCR_JPEG."""
    from edgeocr.doctor import doctor
    monkeypatch.delenv(preprocess.JPEG_ENV, raising=False)
    doctor(None, None)
    assert "[ok  ] jpeg decoder           simplejpeg" in capsys.readouterr().out
    monkeypatch.setenv(preprocess.JPEG_ENV, "pillow")
    doctor(None, None)
    assert "[--  ] jpeg decoder           Pillow" in capsys.readouterr().out
    monkeypatch.setenv(preprocess.JPEG_ENV, "libjpeg")
    assert doctor(None, None) == 1
    assert "[FAIL] jpeg decoder           EDGEOCR_JPEG='libjpeg'" in capsys.readouterr().out
