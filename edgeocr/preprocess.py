"""Image loading and the fixed 1024x1024 letterbox (pure functions under named constants).

The same functions feed the runtime, INT8 calibration and the accuracy checker.  Resampling is
Pillow's default bicubic, as the reference processor uses (spec §5.1); normalization is CLIP's.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeocr.errors import ImageError, ImageTooLarge

CANVAS = 1024                                   # fixed model input edge, pixels
PAD_VALUE = 255                                 # letterbox fill (white: documents)
MEAN = (0.48145466, 0.4578275, 0.40821073)      # CLIP mean, RGB
STD = (0.26862954, 0.26130258, 0.27577711)      # CLIP std, RGB
MAX_ASPECT = 200.0                              # reference processor rejects wider/taller images
MAX_SOURCE_PIXELS = 128 * 1024 * 1024           # refuse to decode larger images (decompression bombs)
MIN_EDGE = 1                                    # pixels


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


def load_image(src) -> "PIL.Image.Image":  # noqa: F821
    """Path, bytes or numpy array (HxW, HxWx3 RGB, HxWx4 RGBA, uint8) -> PIL RGB image."""
    from PIL import Image

    if isinstance(src, np.ndarray):
        a = src
        if a.dtype != np.uint8:
            raise ImageError(f"numpy image must be uint8, got {a.dtype}")
        if a.ndim == 2:
            a = np.stack([a] * 3, axis=-1)
        if a.ndim != 3 or a.shape[2] not in (3, 4):
            raise ImageError(f"numpy image must be HxW, HxWx3 or HxWx4, got shape {a.shape}")
        if a.shape[0] < MIN_EDGE or a.shape[1] < MIN_EDGE:
            raise ImageError(f"numpy image is empty (shape {a.shape})")
        _check_aspect(a.shape[1], a.shape[0], "numpy image")
        return Image.fromarray(np.ascontiguousarray(a[..., :3]), "RGB")
    if isinstance(src, Image.Image):
        _check_aspect(src.width, src.height, "image")
        return src.convert("RGB")
    if isinstance(src, (bytes, bytearray, memoryview)):
        data, name = bytes(src), "image bytes"
    elif isinstance(src, (str, Path)):
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
    else:
        raise ImageError(f"unsupported image type {type(src).__name__}; pass a path, bytes or a numpy array")
    if not data:
        raise ImageError(f"{name}: empty file")
    return decode_bytes(data, name)


def decode_bytes(data: bytes, name: str = "image", max_pixels: int = MAX_SOURCE_PIXELS):
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data))
        w, h = img.size
        if w * h > max_pixels:
            raise ImageTooLarge(f"{name}: {w}x{h} = {w * h} pixels exceeds the limit of {max_pixels}")
        if w < MIN_EDGE or h < MIN_EDGE:
            raise ImageError(f"{name}: empty image ({w}x{h})")
        _check_aspect(w, h, name)
        img.load()          # full decode: truncated files fail here
    except ImageError:
        raise
    except UnidentifiedImageError:
        raise ImageError(f"{name}: not a recognized image format") from None
    except Image.DecompressionBombError as e:
        raise ImageTooLarge(f"{name}: refused as a decompression bomb; it exceeds the limit ({e})") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise ImageError(f"{name}: truncated or corrupt image ({e})") from None
    if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
        bg = Image.new("RGB", img.size, (255, 255, 255))
        bg.paste(img.convert("RGBA"), mask=img.convert("RGBA").split()[-1])
        return bg
    return img.convert("RGB")


def _check_aspect(w: int, h: int, name: str) -> None:
    r = max(w / h, h / w)
    if r > MAX_ASPECT:
        raise ImageError(f"{name}: aspect ratio {r:.0f}:1 ({w}x{h}) exceeds {MAX_ASPECT:.0f}:1")


def letterbox(img, canvas: int = CANVAS, pad_value: int = PAD_VALUE) -> tuple[np.ndarray, Letterbox]:
    """Resize (aspect kept, Pillow bicubic) to fit `canvas`, place top-left, pad the rest.

    Returns the canvas as uint8 [canvas, canvas, 3] and where the image sits on it.
    """
    from PIL import Image

    w, h = img.size
    scale = min(canvas / w, canvas / h)
    nw, nh = max(1, min(canvas, round(w * scale))), max(1, min(canvas, round(h * scale)))
    resized = img if (nw, nh) == (w, h) else img.resize((nw, nh), Image.BICUBIC)
    out = np.full((canvas, canvas, 3), pad_value, dtype=np.uint8)
    out[:nh, :nw] = np.asarray(resized, dtype=np.uint8)
    return out, Letterbox(width=w, height=h, scale=scale, new_w=nw, new_h=nh)


@functools.lru_cache(maxsize=4)
def _lut(mean: tuple[float, ...] = MEAN, std: tuple[float, ...] = STD) -> np.ndarray:
    """[3, 256] float32: the normalized value of every uint8 level per channel, (v/255 - mean) / std."""
    v = np.arange(256, dtype=np.float32) * np.float32(1 / 255)
    return np.stack([(v - np.float32(m)) / np.float32(s) for m, s in zip(mean, std)])


_LUT = _lut()          # the default (CLIP) table, [3, 256]


def normalize(canvas_rgb: np.ndarray, dtype=np.float32, mean: tuple[float, ...] = MEAN,
              std: tuple[float, ...] = STD) -> np.ndarray:
    """uint8 [S, S, 3] -> [1, 3, S, S] (x/255 - mean) / std in float32, through a per-channel lookup table."""
    lut = _lut(tuple(mean), tuple(std))
    chw = np.ascontiguousarray(canvas_rgb.transpose(2, 0, 1))         # [3, S, S] uint8
    out = np.empty((1,) + chw.shape, np.float32)
    for c in range(3):
        np.take(lut[c], chw[c], out=out[0, c])
    return out if dtype == np.float32 else out.astype(dtype)


def patchify(pixels: np.ndarray, patch: int = 16) -> np.ndarray:
    """[1, 3, S, S] -> [N, 3*patch*patch] in the reference processor's raster order (for parity tests)."""
    _, c, s, _ = pixels.shape
    g = s // patch
    return pixels[0].reshape(c, g, patch, g, patch).transpose(1, 3, 0, 2, 4).reshape(g * g, c * patch * patch)
