"""The letterbox and normalization on the GPU in two CUDA kernels, bit-identical to the exact host path.

Pillow's `Image.resize(size, BICUBIC)` on an 8-bit RGB image (what the reference processor and
`preprocess.letterbox` do) is two passes of fixed-point sums, along the rows and along the columns in the order
Pillow picks (`passes`; Pillow 13 runs the vertical pass first where the height shrinks much more): weights
from Pillow's bicubic filter (a = -0.5, widened by the scale when shrinking, renormalized at the borders) rounded to 22
fraction bits, each pass rounded and clipped to 0..255.  `resample_coeffs` computes those weights as Pillow's
`precompute_coeffs` and `normalize_coeffs_8bpc` do, in the same float64 order; `edgeocr/kernels/letterbox.cu`
runs the two passes, pads the canvas and normalizes through `preprocess_graph.lookup_table`.  The numpy twin
(`letterbox_twin`) does the kernels' integer arithmetic on the host: the tests hold it equal to
`preprocess.normalize(preprocess.letterbox(...))` on the CPU and the kernels equal to it on a GPU.

    lb = CudaLetterbox(canvas=1024, pad_value=255, mean=..., std=...)   # compiles the kernels (NVRTC) at load
    pixels, geometry = lb(np.asarray(img))                               # OrtValue [1, 3, S, S] float32 on the GPU

Per page the host copies the decoded image and the weights (28-37 KB for page sizes; computed once per image
size) into pinned memory; the GPU uploads them, 3 bytes a pixel, and runs the two kernels.  No ONNX Runtime
session, no float image on the host.  NVRTC and the driver are what the native decode step needs too (edgeocr.backends.nvrtc).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from pathlib import Path

import numpy as np

from edgeocr import preprocess
from edgeocr.errors import BackendError, ImageError

PRECISION_BITS = 22               # Pillow's 8-bit resampling: 32 - 8 - 2
SOURCE = Path(__file__).resolve().parent / "kernels" / "letterbox.cu"
_A = -0.5                         # Pillow's bicubic


def _bicubic(x: np.ndarray) -> np.ndarray:
    """Pillow's bicubic_filter, elementwise in the order its C source evaluates it."""
    x = np.abs(x)
    near = ((_A + 2.0) * x - (_A + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * _A
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


@functools.lru_cache(maxsize=64)
def resample_coeffs(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's weights for resizing `in_size` pixels to `out_size` (box 0..in_size) ->
    (bounds int32 [out_size, 2]: first source pixel and count; weights int32 [out_size, ksize])."""
    if in_size < 1 or out_size < 1:
        raise ImageError(f"cannot resize {in_size} pixels to {out_size}")
    scale = float(in_size) / out_size
    filterscale = max(scale, 1.0)
    support = 2.0 * filterscale
    ksize = int(np.ceil(support)) * 2 + 1
    center = 0.0 + (np.arange(out_size) + 0.5) * scale
    ss = 1.0 / filterscale
    first = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)
    count = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size) - first
    taps = np.arange(ksize)
    w = _bicubic(((taps[None, :] + first[:, None]) - center[:, None] + 0.5) * ss)
    w = np.where(taps[None, :] < count[:, None], w, 0.0)
    total = np.zeros(out_size)
    for i in range(ksize):                       # summed tap by tap, as the C loop does (not pairwise)
        total = total + w[:, i]
    w = np.where(total[:, None] != 0.0, w / np.where(total == 0.0, 1.0, total)[:, None], w)
    scaled = w * (1 << PRECISION_BITS)
    k = np.where(w < 0, np.trunc(-0.5 + scaled), np.trunc(0.5 + scaled)).astype(np.int32)
    return np.stack([first, count], axis=1).astype(np.int32), k


@functools.cache
def pillow_picks_order() -> bool:
    """Whether the installed Pillow runs the vertical pass first where the height shrinks by more than twice as
    many pixels as the width (Pillow 13 does; earlier releases always run the horizontal pass first).  Probed
    once on a small image on which the two orders differ."""
    from PIL import Image

    rgb = np.random.default_rng(0).integers(0, 256, (200, 40, 3), dtype=np.uint8)
    got = np.asarray(Image.fromarray(rgb).resize((30, 50), Image.BICUBIC))
    for picks in (True, False):
        if np.array_equal(got, resize_twin(rgb, 30, 50, picks)):
            return picks
    raise BackendError("this Pillow's bicubic resize matches neither pass order the letterbox kernels know")


def passes(w: int, h: int, new_w: int, new_h: int, pick_order: bool | None = None) -> list[tuple]:
    """The two passes resizing w x h to new_w x new_h, in Pillow's order: (horizontal, bounds, weights, out_w,
    out_h) each, the first pass's output being the second's input."""
    dh, dw = h - new_h, w - new_w
    picks = pillow_picks_order() if pick_order is None else pick_order
    horizontal_first = not (picks and dh > 0 and dh > 2 * dw)
    hp = (True, *resample_coeffs(w, new_w))
    vp = (False, *resample_coeffs(h, new_h))
    if horizontal_first:
        return [(*hp, new_w, h), (*vp, new_w, new_h)]
    return [(*vp, w, new_h), (*hp, new_w, new_h)]


def _pass(src: np.ndarray, horizontal: bool, bounds: np.ndarray, k: np.ndarray) -> np.ndarray:
    """One fixed-point pass of uint8 [H, W, 3] along its rows or columns, as the kernels compute it."""
    axis = 1 if horizontal else 0
    n_in = src.shape[axis]
    acc = np.full(src.shape[:axis] + (len(bounds),) + src.shape[axis + 1:], 1 << (PRECISION_BITS - 1), np.int64)
    for i in range(k.shape[1]):
        idx = np.minimum(bounds[:, 0] + i, n_in - 1)
        w = np.where(i < bounds[:, 1], k[:, i], 0).astype(np.int64)
        shape = [1, 1, 1]
        shape[axis] = len(bounds)
        acc += np.take(src, idx, axis=axis).astype(np.int64) * w.reshape(shape)
    return np.clip(acc >> PRECISION_BITS, 0, 255).astype(np.uint8)


def resize_twin(rgb: np.ndarray, new_w: int, new_h: int, pick_order: bool | None = None) -> np.ndarray:
    """The kernels' resize on the host: uint8 [H, W, 3] -> [new_h, new_w, 3] (Pillow's BICUBIC, exactly)."""
    out = rgb
    for horizontal, bounds, k, _, _ in passes(rgb.shape[1], rgb.shape[0], new_w, new_h, pick_order):
        out = _pass(out, horizontal, bounds, k)
    return out


def letterbox_twin(rgb: np.ndarray, canvas: int = preprocess.CANVAS, pad_value: int = preprocess.PAD_VALUE,
                   mean=preprocess.MEAN, std=preprocess.STD) -> tuple[np.ndarray, preprocess.Letterbox]:
    """The kernels' whole computation on the host -> ([1, 3, S, S] float32, Letterbox)."""
    from edgeocr.preprocess_graph import lookup_table

    lb = preprocess.letterbox_geometry(rgb.shape[1], rgb.shape[0], canvas)
    levels = np.full((canvas, canvas, 3), pad_value, np.uint8)
    levels[:lb.new_h, :lb.new_w] = resize_twin(rgb, lb.new_w, lb.new_h)
    lut = lookup_table(mean, std).reshape(3, 256)
    return np.stack([lut[c][levels[..., c]] for c in range(3)])[None], lb


def _check_rgb(rgb) -> None:
    if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ImageError(f"the letterbox kernels take a uint8 HxWx3 RGB array, not "
                         f"{getattr(rgb, 'dtype', type(rgb).__name__)} {getattr(rgb, 'shape', '')}")


class CudaLetterbox:
    """The two kernels on one CUDA device, writing into one OrtValue [1, 3, S, S] float32 allocated at load
    (rewritten by every call: use the pixels before the next call).  Device and pinned buffers grow to the
    largest image seen.  Calls are serialized (a lock): one page at a time goes through the buffers."""

    def __init__(self, canvas: int = preprocess.CANVAS, pad_value: int = preprocess.PAD_VALUE,
                 mean=preprocess.MEAN, std=preprocess.STD, device_id: int = 0):
        try:
            import onnxruntime as ort
        except ImportError:
            raise BackendError("ONNX Runtime is not installed: pip install 'edgeocr[cuda]'") from None
        from edgeocr.backends import cudart, nvrtc
        from edgeocr.backends.memory import CudaMemory
        from edgeocr.preprocess_graph import lookup_table

        if not 0 <= pad_value <= 255:
            raise ValueError(f"pad_value must be a uint8 level, not {pad_value}")
        self.canvas, self.pad_value, self.device_id = canvas, pad_value, device_id
        self.stream, self._host_ptr = 0, 0
        self._lock = threading.Lock()
        pillow_picks_order()                              # a Pillow the kernels cannot follow fails here, at load
        self.cuda = cudart.load()
        self.cuda.make_current(device_id)
        arch, _ = nvrtc.device_arch(device_id)
        self.mod = nvrtc.Module(nvrtc.compile_cubin(SOURCE.read_text(), arch, name="letterbox.cu"),
                                ("letterbox_pass", "letterbox_canvas"))
        try:
            self.pixels = ort.OrtValue.ortvalue_from_shape_and_type((1, 3, canvas, canvas), np.float32, "cuda",
                                                                    device_id)
        except Exception as e:  # noqa: BLE001  (onnxruntime raises its own types; a CPU-only build among them)
            raise BackendError(f"ONNX Runtime cannot hold the page on CUDA device {device_id} ({e}); "
                               "pip install 'edgeocr[cuda]'") from None
        self.mem = CudaMemory(None)
        self.stream = self.cuda.stream_create(non_blocking=True)
        self.lut = self.mem.alloc((768,), np.float32, zero=False)
        self.mem.write(self.lut, lookup_table(mean, std))
        self._cap = {"host": 0, "src": 0, "tmp": 0, "coef": 0}
        self._src = self._tmp = self._coef = None

    def _grow(self, name: str, nbytes: int) -> None:
        if nbytes <= self._cap[name]:
            return
        nbytes = max(nbytes, self._cap[name] * 5 // 4)
        if name == "host":
            if self._host_ptr:
                ptr, self._host_ptr, self._cap["host"] = self._host_ptr, 0, 0
                self.cuda.lib.cudaFreeHost(ctypes.c_void_p(ptr))
            self._host_ptr = self.cuda.host_alloc(nbytes)
        else:
            setattr(self, "_" + name, None)               # the old buffer goes before the larger one comes
            self._cap[name] = 0
            setattr(self, "_" + name, self.mem.alloc((nbytes,), np.uint8, zero=False))
        self._cap[name] = nbytes

    def __call__(self, rgb: np.ndarray, size: tuple[int, int] | None = None):
        """uint8 [H, W, 3] -> (pixels OrtValue [1, 3, S, S] float32 on the GPU, Letterbox).  `size` must be the
        array's own (width, height) if given: these kernels resize the whole decoded image."""
        _check_rgb(rgb)
        h, w = rgb.shape[:2]
        if size is not None and tuple(size) != (w, h):
            raise ImageError(f"the letterbox kernels resize the decoded image itself ({w}x{h}), not a "
                             f"reduced-scale decode of {size[0]}x{size[1]}")
        lb = preprocess.letterbox_geometry(w, h, self.canvas)
        (h1, b1, k1, w1, r1), (h2, b2, k2, _, _) = passes(w, h, lb.new_w, lb.new_h)
        coef = np.concatenate([a.ravel() for a in (b1, k1, b2, k2)]).astype(np.int32)
        img = np.ascontiguousarray(rgb)
        with self._lock:
            self.cuda.lib.cudaSetDevice(self.device_id)     # this thread's device (a worker thread may call)
            try:
                self._enqueue(img, coef, w, h, lb, (h1, b1, k1, w1, r1), (h2, b2, k2))
            finally:
                # the pinned buffer is rewritten by the next call, and the vision graph runs on ONNX Runtime's
                # own stream: the page is on the device when this returns (or the call failed, and nothing of it
                # is in flight)
                self.cuda.stream_sync(self.stream)
        return self.pixels, lb

    def _enqueue(self, img, coef, w, h, lb, first, second) -> None:
        h1, b1, k1, w1, r1 = first
        h2, b2, k2 = second
        self._grow("host", img.nbytes + coef.nbytes)
        self._grow("src", img.nbytes)
        self._grow("tmp", w1 * r1 * 3)
        self._grow("coef", coef.nbytes)
        ctypes.memmove(self._host_ptr, img.ctypes.data, img.nbytes)
        ctypes.memmove(self._host_ptr + img.nbytes, coef.ctypes.data, coef.nbytes)
        cu, s = self.cuda, self.stream
        cu.memcpy_async(self._src.ptr, self._host_ptr, img.nbytes, "htod", s)
        cu.memcpy_async(self._coef.ptr, self._host_ptr + img.nbytes, coef.nbytes, "htod", s)
        at = [self._coef.ptr]
        for a in (b1, k1, b2):
            at.append(at[-1] + a.size * 4)
        p, i32 = ctypes.c_void_p, ctypes.c_int
        self.mod.launch("letterbox_pass", ((w1 + 127) // 128, min(r1, 65535)), (128,), s,
                        [p(self._src.ptr), i32(w * 3), i32(h1), p(self._tmp.ptr), i32(w1), i32(r1),
                         p(at[0]), p(at[1]), i32(k1.shape[1])])
        self.mod.launch("letterbox_canvas", ((self.canvas + 127) // 128, self.canvas), (128,), s,
                        [p(self._tmp.ptr), i32(w1 * 3), i32(h2), i32(lb.new_w), i32(lb.new_h), p(at[2]),
                         p(at[3]), i32(k2.shape[1]), p(self.lut.ptr), i32(self.pad_value), i32(self.canvas),
                         p(self.pixels.data_ptr())])

    def __del__(self):
        try:
            if getattr(self, "_host_ptr", 0):
                self.cuda.lib.cudaFreeHost(ctypes.c_void_p(self._host_ptr))
            if getattr(self, "stream", 0):
                self.cuda.lib.cudaStreamDestroy(ctypes.c_void_p(self.stream))
            mod = getattr(self, "mod", None)
            if mod is not None:
                mod.cu.cuModuleUnload(mod.mod)
        except Exception:  # noqa: BLE001  (interpreter shutdown: the context may be gone already)
            pass
