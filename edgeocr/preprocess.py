"""Image loading and the fixed 1024x1024 letterbox (pure functions under named constants).

The same functions feed the runtime, INT8 calibration and the accuracy checker.  Resampling is
Pillow's default bicubic, as the reference processor uses (spec §5.1); normalization is CLIP's.

Two host paths:
- exact (the reference): Pillow decodes the whole image and resizes it with its antialiased bicubic.
- fast: a JPEG is decoded at 1/2, 1/4 or 1/8 scale where the letterbox shrinks it at least twice that much
  (libjpeg's DCT scaling, `load_image_for_canvas`), and OpenCV resizes (`letterbox_fast`).  Not bit-exact:
  docs/perf.md gives the measured pixel, embedding and token differences.
A third path runs the resize and normalization on the GPU: edgeocr.preprocess_graph.
"""

from __future__ import annotations

import functools
import io
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeocr.errors import BackendError, ImageError, ImageTooLarge, PageTooSmall

CANVAS = 1024                                   # fixed model input edge, pixels
PAD_VALUE = 255                                 # letterbox fill (white: documents)
MEAN = (0.48145466, 0.4578275, 0.40821073)      # CLIP mean, RGB
STD = (0.26862954, 0.26130258, 0.27577711)      # CLIP std, RGB
MAX_ASPECT = 200.0                              # reference processor rejects wider/taller images
DEFAULT_MAX_PIXELS = 40_000_000                 # the pixel limit `max_pixels`: larger images are refused
                                                # from their header, before decoding (decompression bombs)
MAX_PIXELS_ENV = "EDGEOCR_MAX_PIXELS"           # its environment twin (flag: --max-pixels)
MIN_EDGE = 16                                   # pixels: a page narrower or shorter than one 16-px ViT patch
                                                # holds no legible text and is refused
INK_CONTRAST = 48                               # levels (of 255) from the background level that count as ink
BLANK_MAX_INK = 1e-4                            # a page with a smaller share of ink pixels is blank


@dataclass(frozen=True)
class Letterbox:
    """Where the original image sits on the canvas."""

    width: int          # original image width, pixels
    height: int         # original image height, pixels
    scale: float        # canvas pixels per original pixel
    new_w: int          # resized width on the canvas
    new_h: int          # resized height on the canvas
    left: int = 0       # x offset of the image on the canvas
    top: int = 0        # y offset

    def to_original(self, x: float, y: float) -> tuple[int, int]:
        """Canvas pixel -> original pixel, clamped to the image."""
        ox = (x - self.left) / self.scale
        oy = (y - self.top) / self.scale
        return (int(min(max(ox, 0), self.width)), int(min(max(oy, 0), self.height)))


@dataclass(frozen=True)
class ImageBytes:
    """An encoded image with the pixel limit it was accepted under (the daemon's `max_pixels`)."""

    data: bytes                  # PNG, JPEG, ... as received
    max_pixels: int              # pixel limit, pixels
    name: str = "image"          # what messages call it


def pixel_limit(value: int | None = None, environ=os.environ) -> int:
    """The pixel limit in force: `value` when given, else EDGEOCR_MAX_PIXELS, else DEFAULT_MAX_PIXELS."""
    if value is None:
        raw = environ.get(MAX_PIXELS_ENV)
        if raw is None or not raw.strip():
            return DEFAULT_MAX_PIXELS
        try:
            value = int(raw.strip().replace("_", ""))
        except ValueError:
            raise ImageError(f"{MAX_PIXELS_ENV}={raw!r}: not an integer number of pixels") from None
        where = MAX_PIXELS_ENV
    else:
        where = "max_pixels"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ImageError(f"{where} must be a positive integer number of pixels, got {value!r}")
    return value


def check_size(w: int, h: int, name: str, max_pixels: int | None = None) -> None:
    """The checks every page passes before a pixel is decoded: the pixel limit, the minimum edge, the aspect
    ratio.  Raises ImageTooLarge, PageTooSmall or ImageError naming the page and the limit."""
    limit = pixel_limit(max_pixels)
    if w * h > limit:
        raise ImageTooLarge(f"{name}: {w}x{h} = {w * h:,} pixels exceeds the pixel limit of {limit:,} "
                            f"(max_pixels: --max-pixels or {MAX_PIXELS_ENV})")
    if w < MIN_EDGE or h < MIN_EDGE:
        raise PageTooSmall(f"{name}: {w}x{h} pixels is smaller than the minimum page of {MIN_EDGE}x{MIN_EDGE} "
                           f"pixels")
    _check_aspect(w, h, name)


def is_blank(rgb) -> bool:
    """Whether a page has no ink: fewer than BLANK_MAX_INK of its pixels differ from the page's background
    level (the most common level, per channel) by more than INK_CONTRAST.  rgb: [H, W, C] uint8, or a PIL image.
    Per-channel histograms: linear time, no sort; for RGB pages Pillow's one-pass histogram (1.5 ms for a
    721 x 1,081 page against 5 ms for numpy's bincount per channel: this check is on the first token's path)."""
    from PIL import Image

    if isinstance(rgb, np.ndarray):
        if rgb.ndim != 3 or rgb.size == 0:
            return False
        if rgb.shape[2] != 3 or rgb.dtype != np.uint8:                  # not RGB: numpy, channel by channel
            return _blank_from(rgb.shape[0] * rgb.shape[1],
                               [np.bincount(rgb[..., c].ravel(), minlength=256) for c in range(rgb.shape[2])])
        rgb = Image.fromarray(np.ascontiguousarray(rgb))
    elif rgb.mode != "RGB":
        rgb = rgb.convert("RGB")
    n = rgb.width * rgb.height
    return n > 0 and _blank_from(n, np.asarray(rgb.histogram(), np.int64).reshape(3, 256))


def _blank_from(n: int, hists) -> bool:
    """is_blank from a page's `n` pixels and one 256-level histogram per channel."""
    levels = np.arange(256)
    ink = 0
    for hist in hists:                                                   # [256] per channel
        bg = int(np.argmax(hist))
        ink = max(ink, int(hist[np.abs(levels - bg) > INK_CONTRAST].sum()))
    return ink < BLANK_MAX_INK * n


def load_image(src, max_pixels: int | None = None) -> "PIL.Image.Image":  # noqa: F821
    """Path, bytes, ImageBytes or numpy array (HxW, HxWx3 RGB, HxWx4 RGBA, uint8) -> PIL RGB image.
    An encoded image larger than the pixel limit (`pixel_limit(max_pixels)`) is refused from its header."""
    from PIL import Image

    if isinstance(src, np.ndarray):
        a = src
        if a.dtype != np.uint8:
            raise ImageError(f"numpy image must be uint8, got {a.dtype}")
        if a.ndim == 2:
            a = np.stack([a] * 3, axis=-1)
        if a.ndim != 3 or a.shape[2] not in (3, 4):
            raise ImageError(f"numpy image must be HxW, HxWx3 or HxWx4, got shape {a.shape}")
        if a.shape[0] == 0 or a.shape[1] == 0:
            raise ImageError(f"numpy image is empty (shape {a.shape})")
        check_size(a.shape[1], a.shape[0], "numpy image", a.shape[0] * a.shape[1])   # decoded already
        return Image.fromarray(np.ascontiguousarray(a[..., :3]), "RGB")
    if isinstance(src, Image.Image):
        check_size(src.width, src.height, "image", src.width * src.height)
        return src.convert("RGB")
    enc = encoded(src, max_pixels)
    if enc is None:
        raise ImageError(f"unsupported image type {type(src).__name__}; pass a path, bytes or a numpy array")
    return decode_bytes(*enc)


def encoded(src, max_pixels: int | None = None) -> tuple[bytes, str, int | None] | None:
    """(data, the name messages use, pixel limit) of an encoded source: a path or bytes (read here, under
    `max_pixels`) or an ImageBytes (under its own limit); None for anything else (a decoded image)."""
    if isinstance(src, ImageBytes):
        return src.data, src.name, src.max_pixels
    if isinstance(src, (bytes, bytearray, memoryview, str, Path)):
        return (*read_bytes(src), max_pixels)
    return None


def decode_bytes(data: bytes, name: str = "image", max_pixels: int | None = None):
    return _decode(data, name, max_pixels)[0]


def open_image(data: bytes, name: str = "image", max_pixels: int | None = None) -> "PIL.Image.Image":  # noqa: F821
    """Identify an encoded image and read its header (no pixel is decoded), then check its size
    (`check_size`).  Pillow's own decompression-bomb limit is not consulted: the one limit is
    edgeocr's `max_pixels`, and its message is the one the user sees."""
    from PIL import Image

    fp, prefix = io.BytesIO(data), data[:16]
    for loader in (Image.preinit, Image.init):      # common formats first, then every plugin (as Image.open)
        loader()
        for fmt in list(Image.ID):
            factory, accept = Image.OPEN[fmt]
            ok = accept(prefix) if accept else True
            if not ok or isinstance(ok, str):
                continue
            fp.seek(0)
            try:
                img = factory(fp, "")
            except (SyntaxError, IndexError, TypeError, struct.error):
                continue
            check_size(*img.size, name, max_pixels)
            return img
    raise ImageError(f"{name}: not a recognized image format")


def _decode(data: bytes, name: str, max_pixels: int | None = None, canvas: int | None = None):
    """-> (RGB PIL image, original (width, height)).  With `canvas`, a JPEG is decoded at the largest DCT
    reduction (1/2, 1/4, 1/8) that still covers twice its letterbox size on that canvas."""
    from PIL import Image, UnidentifiedImageError

    try:
        img = open_image(data, name, max_pixels)
        w, h = img.size
        if canvas is not None and img.format == "JPEG":
            # libjpeg picks the strongest reduction still >= the requested size.  Twice the letterbox size:
            # DCT-scaled output is sharper than Pillow's antialiased bicubic, and what is left to shrink
            # (>= 2x) is area-averaged by letterbox_fast, which tracks Pillow closely (docs/perf.md)
            _, nw, nh = letterbox_size(w, h, canvas)
            img.draft("RGB", (2 * nw, 2 * nh))
        img.load()          # full decode: truncated files fail here
    except ImageError:
        raise
    except UnidentifiedImageError:
        raise ImageError(f"{name}: not a recognized image format") from None
    except Image.DecompressionBombError:      # a frame or tile past Pillow's own limit, inside a page within ours
        raise ImageTooLarge(f"{name}: a frame of this image exceeds Pillow's decoder limit; it cannot be read "
                            f"(max_pixels {pixel_limit(max_pixels):,})") from None
    except (OSError, ValueError, SyntaxError, EOFError, struct.error) as e:
        raise ImageError(f"{name}: truncated or corrupt image ({e})") from None
    if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
        bg = Image.new("RGB", img.size, (255, 255, 255))
        bg.paste(img.convert("RGBA"), mask=img.convert("RGBA").split()[-1])
        return bg, (w, h)
    # an RGB image is returned as decoded: convert("RGB") would copy its pixels (about 1 ms on a 721 x 1,081 page,
    # on the first token's path)
    return (img if img.mode == "RGB" else img.convert("RGB")), (w, h)


JPEG_ENV = "EDGEOCR_JPEG"                       # "simplejpeg" (default where installed) | "pillow"
_SIMPLEJPEG_COLORSPACES = ("Gray", "YCbCr", "RGB")


def jpeg_decoder() -> str:
    """Which library decodes a JPEG into an array for the device path: "simplejpeg" where it is installed (the
    [cuda] extra; libjpeg-turbo straight into a numpy array: the same pixels as Pillow's own libjpeg-turbo decode,
    without its copy out, 3.3 against 4.5 + 1.0 ms for a 721 x 1,081 page on one core: docs/perf.md section 18),
    else "pillow".  EDGEOCR_JPEG=pillow picks Pillow.  Read once, when a preparer is made."""
    want = os.environ.get(JPEG_ENV, "").strip().lower()
    if want not in ("", "simplejpeg", "pillow"):
        raise BackendError(f"{JPEG_ENV}={want!r}: use 'simplejpeg' or 'pillow'")
    if want == "pillow":
        return "pillow"
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        if want == "simplejpeg":
            raise BackendError(f"{JPEG_ENV}=simplejpeg but simplejpeg is not installed: pip install simplejpeg "
                               "(part of the [cuda] extra)") from None
        return "pillow"
    return "simplejpeg"


def decode_jpeg_array(data: bytes, name: str = "image",
                      max_pixels: int | None = None) -> tuple[np.ndarray, tuple[int, int]] | None:
    """An encoded JPEG decoded by simplejpeg into an [H, W, 3] uint8 RGB array, with its (width, height), once
    its header passed `check_size`.  None where Pillow should decode it instead: not a JPEG, a CMYK/YCCK JPEG, or
    any libjpeg warning or error (strict mode: a truncated or corrupt file gets Pillow's error message, as on every
    other path).  Called where `jpeg_decoder()` is "simplejpeg"."""
    if bytes(data[:3]) != b"\xff\xd8\xff":
        return None
    import simplejpeg

    try:
        h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    if colorspace not in _SIMPLEJPEG_COLORSPACES:
        return None
    check_size(w, h, name, max_pixels)
    try:
        rgb = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False, strict=True)
    except ValueError:
        return None
    return rgb, (w, h)


def load_image_for_canvas(src, canvas: int = CANVAS,
                          max_pixels: int | None = None) -> tuple["PIL.Image.Image", tuple[int, int]]:  # noqa: F821
    """load_image for the fast path: a JPEG file or bytes is decoded at reduced scale where the letterbox
    allows (see _decode).  Returns the RGB image and the source's original (width, height), which the
    letterbox geometry and the boxes of the result refer to."""
    enc = encoded(src, max_pixels)
    if enc is not None:
        return _decode(*enc, canvas=canvas)
    img = load_image(src, max_pixels)
    return img, img.size


def read_bytes(src) -> tuple[bytes, str]:
    """Path or bytes -> (bytes, the name messages use); ImageError for a missing, unreadable or empty file."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        data, name = bytes(src), "image bytes"
    else:
        p = Path(src)
        name = str(p)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            raise ImageError(f"{p}: no such file") from None
        except IsADirectoryError:
            raise ImageError(f"{p}: is a directory, not an image") from None
        except OSError as e:
            raise ImageError(f"{p}: cannot be read ({e.strerror})") from None
    if not data:
        raise ImageError(f"{name}: empty file")
    return data, name


def _check_aspect(w: int, h: int, name: str) -> None:
    r = max(w / h, h / w)
    if r > MAX_ASPECT:
        raise ImageError(f"{name}: aspect ratio {r:.0f}:1 ({w}x{h}) exceeds {MAX_ASPECT:.0f}:1")


def letterbox_size(w: int, h: int, canvas: int = CANVAS) -> tuple[float, int, int]:
    """(scale, new_w, new_h): the aspect-kept size of a w x h image fitted into the canvas."""
    scale = min(canvas / w, canvas / h)
    return scale, max(1, min(canvas, round(w * scale))), max(1, min(canvas, round(h * scale)))


def letterbox_geometry(w: int, h: int, canvas: int = CANVAS) -> Letterbox:
    """Where a w x h image sits on the canvas (top-left), without resizing anything."""
    scale, nw, nh = letterbox_size(w, h, canvas)
    return Letterbox(width=w, height=h, scale=scale, new_w=nw, new_h=nh)


def letterbox(img, canvas: int = CANVAS, pad_value: int = PAD_VALUE) -> tuple[np.ndarray, Letterbox]:
    """Resize (aspect kept, Pillow bicubic) to fit `canvas`, place top-left, pad the rest.

    Returns the canvas as uint8 [canvas, canvas, 3] and where the image sits on it.
    """
    from PIL import Image

    lb = letterbox_geometry(*img.size, canvas)
    nw, nh = lb.new_w, lb.new_h
    resized = img if (nw, nh) == img.size else img.resize((nw, nh), Image.BICUBIC)
    out = np.full((canvas, canvas, 3), pad_value, dtype=np.uint8)
    out[:nh, :nw] = np.asarray(resized, dtype=np.uint8)
    return out, lb


def letterbox_fast(img, size: tuple[int, int] | None = None, canvas: int = CANVAS,
                   pad_value: int = PAD_VALUE) -> tuple[np.ndarray, Letterbox]:
    """letterbox with OpenCV's resize: bicubic where it shrinks less than 2x or enlarges, area averaging
    where it shrinks more (bicubic without antialiasing would alias there).  `img`: PIL image or uint8
    HxWx3 array, possibly decoded at reduced scale; `size`: the source's original (width, height) the
    geometry refers to (default: img's own size)."""
    try:
        import cv2
    except ImportError as e:
        raise ImageError(f"the fast preprocessing path needs OpenCV ({e}): pip install 'edgeocr[fast]'") from None
    rgb = np.asarray(img, dtype=np.uint8)
    lb = letterbox_geometry(*(size or (rgb.shape[1], rgb.shape[0])), canvas)
    nw, nh = lb.new_w, lb.new_h
    out = np.full((canvas, canvas, 3), pad_value, dtype=np.uint8)
    if (nw, nh) == (rgb.shape[1], rgb.shape[0]):
        out[:nh, :nw] = rgb
    else:
        shrink = min(nw / rgb.shape[1], nh / rgb.shape[0])
        cv2.resize(rgb, (nw, nh), dst=out[:nh, :nw], interpolation=cv2.INTER_AREA if shrink < 0.5 else cv2.INTER_CUBIC)
    return out, lb


@functools.lru_cache(maxsize=4)
def _lut(mean: tuple[float, ...] = MEAN, std: tuple[float, ...] = STD) -> np.ndarray:
    """[3, 256] float32: the normalized value of every uint8 level per channel, (v/255 - mean) / std."""
    v = np.arange(256, dtype=np.float32) * np.float32(1 / 255)
    return np.stack([(v - np.float32(m)) / np.float32(s) for m, s in zip(mean, std)])


_LUT = _lut()          # the default (CLIP) table, [3, 256]


def normalize(canvas_rgb: np.ndarray, dtype=np.float32, mean: tuple[float, ...] = MEAN,
              std: tuple[float, ...] = STD) -> np.ndarray:
    """uint8 [S, S, 3] -> [1, 3, S, S] (x/255 - mean) / std in float32: the same float32 operations, in the
    same order, as the lookup table `_lut` (so bit-identical to it), done in place plane by plane."""
    chw = canvas_rgb.transpose(2, 0, 1)                                 # [3, S, S] uint8 view
    out = np.empty((1,) + chw.shape, np.float32)
    for c, (m, s) in enumerate(zip(mean, std)):
        plane = out[0, c]
        np.multiply(chw[c], np.float32(1 / 255), out=plane, dtype=np.float32)
        plane -= np.float32(m)
        plane /= np.float32(s)
    return out if dtype == np.float32 else out.astype(dtype)


def patchify(pixels: np.ndarray, patch: int = 16) -> np.ndarray:
    """[1, 3, S, S] -> [N, 3*patch*patch] in the reference processor's raster order (for parity tests)."""
    _, c, s, _ = pixels.shape
    g = s // patch
    return pixels[0].reshape(c, g, patch, g, patch).transpose(1, 3, 0, 2, 4).reshape(g * g, c * patch * patch)
