"""Bad input gets a clear error naming what is wrong, never a crash."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from conftest import make_image
from edgeocr import ArtifactError, ImageError, PromptError
from edgeocr.decode import DecodeOptions
from edgeocr.model import OCRModel


@pytest.fixture(scope="module")
def model(art_a):
    return OCRModel(art_a)


def _png(arr) -> bytes:
    b = io.BytesIO()
    Image.fromarray(arr).save(b, "PNG")
    return b.getvalue()


def test_unreadable_and_truncated_images(model, tmp_path):
    good = _png(make_image(0))
    cases = {
        "truncated.png": (good[: len(good) // 2], "truncated or corrupt"),
        "empty.png": (b"", "empty file"),
        "text.png": (b"hello, I am not an image", "not a recognized image format"),
    }
    for name, (data, msg) in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(ImageError, match=msg):
            model.recognize(p)
    with pytest.raises(ImageError, match="no such file"):
        model.recognize(tmp_path / "missing.png")
    with pytest.raises(ImageError, match="is a directory"):
        model.recognize(tmp_path)
    with pytest.raises(ImageError, match="truncated or corrupt"):
        model.recognize(good[:200])
    # the model still works after all that
    assert model.recognize(good, options=DecodeOptions(max_new_tokens=2)).generated_tokens >= 1


def _noise(h, w) -> np.ndarray:
    return np.random.default_rng(h * w).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_extreme_aspect_ratio(model):
    with pytest.raises(ImageError, match="aspect ratio"):
        model.recognize(np.zeros((16, 3300, 3), np.uint8))
    with pytest.raises(ImageError, match="aspect ratio"):
        model.recognize(_png(np.zeros((3300, 16, 3), np.uint8)))
    # 1:100 is allowed and runs
    r = model.recognize(_noise(16, 1600), options=DecodeOptions(max_new_tokens=2))
    assert r.image_size == (1600, 16) and r.generated_tokens == 2


def test_bad_numpy_images(model):
    with pytest.raises(ImageError, match="uint8"):
        model.recognize(np.zeros((10, 10, 3), np.float32))
    with pytest.raises(ImageError, match="shape"):
        model.recognize(np.zeros((10, 10, 5), np.uint8))
    with pytest.raises(ImageError, match="empty"):
        model.recognize(np.zeros((0, 10, 3), np.uint8))
    with pytest.raises(ImageError, match="unsupported image type"):
        model.recognize(12345)


def test_pixel_bomb_refused_before_decode():
    from edgeocr import preprocess
    big = _png(np.zeros((300, 300, 3), np.uint8))
    with pytest.raises(ImageError, match=r"bomb.png: 300x300 = 90,000 pixels exceeds the pixel limit of 89,700 "
                                         r"\(max_pixels: --max-pixels or EDGEOCR_MAX_PIXELS\)"):
        preprocess.decode_bytes(big, "bomb.png", max_pixels=300 * 299)


def test_one_pixel_limit_and_never_pillows(model, monkeypatch):
    """The limit is edgeocr's setting everywhere (argument, then EDGEOCR_MAX_PIXELS, then the default);
    Pillow's own decompression-bomb check (89.5 MP warning, 179 MP error) is never what the user sees."""
    import warnings

    from serve_harness import pixel_bomb
    from edgeocr import preprocess
    from edgeocr.errors import ImageTooLarge
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # Pillow's DecompressionBombWarning would raise here
        for w, h in ((9000, 9000), (20000, 20000), (30000, 30000)):
            with pytest.raises(ImageTooLarge) as e:
                model.recognize(pixel_bomb(w, h))
            assert str(e.value) == (f"image bytes: {w}x{h} = {w * h:,} pixels exceeds the pixel limit of 40,000,000 "
                                    f"(max_pixels: --max-pixels or EDGEOCR_MAX_PIXELS)")
        # raised above Pillow's limit: the header passes, the (fake) pixel data then fails as corrupt, not as a bomb
        with pytest.raises(ImageError, match="truncated or corrupt"):
            preprocess.decode_bytes(pixel_bomb(10000, 10000), max_pixels=200_000_000)
    monkeypatch.setenv("EDGEOCR_MAX_PIXELS", "1000")
    assert preprocess.pixel_limit() == 1000 and preprocess.pixel_limit(5) == 5
    with pytest.raises(ImageTooLarge, match="exceeds the pixel limit of 1,000"):
        model.recognize(_png(make_image(0)))
    monkeypatch.setenv("EDGEOCR_MAX_PIXELS", "lots")
    with pytest.raises(ImageError, match="EDGEOCR_MAX_PIXELS='lots': not an integer"):
        preprocess.pixel_limit()


def test_pages_under_the_minimum_are_refused_and_blank_pages_skip_the_model(model):
    from edgeocr.errors import PageTooSmall
    for arr in (np.full((1, 1, 3), 255, np.uint8), np.zeros((15, 600, 3), np.uint8)):
        with pytest.raises(PageTooSmall, match="smaller than the minimum page of 16x16 pixels"):
            model.recognize(_png(arr))
    for blank in (np.full((300, 400, 3), 255, np.uint8), np.full((64, 64, 3), (30, 90, 200), np.uint8)):
        r = model.recognize(blank, task="spotting")
        assert (r.finish_reason, r.text, r.lines, r.generated_tokens, r.token_ids) == ("blank", "", [], 0, [])
        assert r.image_size == (blank.shape[1], blank.shape[0])
        assert list(model.stream(blank)) == []
        assert [r.finish_reason for _, r in model.recognize_many([blank, make_image(1)],
                                                                 options=DecodeOptions(max_new_tokens=2))] \
            in (["blank", "length"], ["length", "blank"])
    # a few dark strokes are ink: the model runs
    page = np.full((300, 400, 3), 255, np.uint8)
    page[100:104, 50:200] = 0
    assert model.recognize(page, options=DecodeOptions(max_new_tokens=2)).generated_tokens == 2


def test_grayscale_and_rgba_accepted(model):
    gray = np.full((64, 64), 128, np.uint8)
    gray[20:30, 10:50] = 0
    rgba = np.zeros((64, 64, 4), np.uint8)
    rgba[20:30, 10:50, 3] = 255                      # an opaque black bar on a transparent (white) page
    gray, rgba = Image.fromarray(gray, "L"), Image.fromarray(rgba, "RGBA")
    for im in (gray, rgba):
        b = io.BytesIO()
        im.save(b, "PNG")
        assert model.recognize(b.getvalue(), options=DecodeOptions(max_new_tokens=1)).generated_tokens == 1


def test_prompt_errors(model):
    img = make_image(0)
    with pytest.raises(PromptError, match="longer than"):
        model.recognize(img, prompt="word " * 2000)
    with pytest.raises(PromptError, match="unknown task"):
        model.recognize(img, task="poetry")
    with pytest.raises(PromptError, match="non-empty"):
        model.recognize(img, prompt="   ")
    with pytest.raises(PromptError, match="either a task or a custom prompt, not both"):
        model.recognize(img, task="spotting", prompt="Output the value of Total.")
    with pytest.raises(PromptError, match="max_new_tokens"):
        model.recognize(img, options=DecodeOptions(max_new_tokens=0))


def test_artifact_errors(art_a, tmp_path):
    with pytest.raises(ArtifactError, match="no such artifact directory"):
        OCRModel(tmp_path / "nope")
    with pytest.raises(ArtifactError, match="no manifest.json"):
        OCRModel(tmp_path)
    with pytest.raises(ArtifactError, match="not a directory"):
        OCRModel(art_a / "manifest.json")
    bad = tmp_path / "old"
    shutil.copytree(art_a, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["format_version"] = 99
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="format_version 99"):
        OCRModel(bad)
    from edgeocr.artifact import FORMAT_VERSION
    m["format_version"] = FORMAT_VERSION
    del m["kv_cache"]["cache_len"]
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="malformed or missing field.*cache_len"):
        OCRModel(bad)
    m["kv_cache"]["cache_len"] = 1536
    files, m["files"] = m["files"], list(m["files"])         # a list of names instead of name -> size, hash
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="files must map each file name"):
        OCRModel(bad)
    m["files"] = files
    (bad / "manifest.json").write_text(json.dumps(m))
    (bad / "decoder.onnx.data").write_bytes(b"short")
    with pytest.raises(ArtifactError, match="decoder.onnx.data"):
        OCRModel(bad)
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        OCRModel(bad)


def test_cache_full_is_reported(art_a, tmp_path):
    """A generation that reaches the end of the static cache stops with finish_reason cache_full."""
    model = OCRModel(art_a)
    r = model.recognize(make_image(0), task="structured_parse",
                        options=DecodeOptions(max_new_tokens=5000, ignore_stop=True, tail_repetition_stop=False))
    assert r.finish_reason == "cache_full"
    assert r.prompt_tokens + r.generated_tokens == model.session.cache_len + 1


def test_gqa_fp32_on_cuda_is_refused_with_the_fix(gqa_arts):
    from edgeocr.errors import BackendError
    with pytest.raises(BackendError, match="--precision fp16"):
        OCRModel(gqa_arts["a"], device="cuda")


def test_cuda_graph_needs_the_fixed_address_flavour(art_a, gqa_arts):
    from edgeocr.errors import BackendError
    for art, dev in ((art_a, "cuda"), (gqa_arts["a"], "cuda"), (gqa_arts["a"], "cpu")):
        with pytest.raises(BackendError, match="--attention gqa --select-on-device"):
            OCRModel(art, device=dev, cuda_graph=True)
    assert not OCRModel(gqa_arts["a"]).session.cuda_graph          # auto (the default): only where it can
