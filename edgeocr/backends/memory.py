"""Buffers a session allocates once and binds to ONNX Runtime by address: host (numpy) or CUDA device memory.

Both kinds expose the same few operations, so the sessions in ort.py are written once for CPU and CUDA:
`alloc` a buffer, `write` host data into (a part of) it, `read` it back into a preallocated host array, and
`copy_rows` — the masked decoder's new K/V rows into the static cache.  Offsets are in elements of the
buffer's dtype; nothing here allocates after load.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Buffer:
    ptr: int                      # address of element 0 (host or device)
    shape: tuple[int, ...]
    dtype: np.dtype
    host: np.ndarray | None       # the numpy array itself for host buffers, None on the device
    keep: object = None           # the owner keeping device memory alive

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.itemsize

    def at(self, index: int) -> int:
        """Address of row `index` of the leading dimension (a slot's part of a [slots, ...] buffer)."""
        return self.ptr + index * (self.nbytes // self.shape[0])


def _check_span(buf: Buffer, offset: int, n: int) -> None:
    """Device copies have no bounds of their own: refuse one that would leave the buffer."""
    if offset < 0 or offset + n > buf.nbytes // buf.itemsize:
        raise IndexError(f"copy of {n} elements at {offset} outside a buffer of shape {buf.shape}")


def _span(blob: Buffer, offset: int, shape, dtype) -> int:
    """Bytes of a `shape` x `dtype` view at `offset` of `blob`, refused if it leaves it or is misaligned."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if offset < 0 or offset + n > blob.nbytes or offset % np.dtype(dtype).itemsize:
        raise IndexError(f"a view of {n} bytes at {offset} outside (or misaligned in) a {blob.nbytes}-byte buffer")
    return n


class HostMemory:
    """numpy arrays: ONNX Runtime's CPU provider reads and writes them in place."""

    device = "cpu"

    def alloc(self, shape, dtype, zero: bool = True) -> Buffer:
        a = np.zeros(shape, dtype)
        return Buffer(a.ctypes.data, tuple(shape), a.dtype, a)

    def write(self, buf: Buffer, data: np.ndarray, offset: int = 0) -> None:
        flat = buf.host.reshape(-1)
        src = np.asarray(data, buf.dtype).reshape(-1)
        flat[offset:offset + src.size] = src

    def read(self, buf: Buffer, out: np.ndarray, offset: int = 0) -> np.ndarray:
        out.reshape(-1)[...] = buf.host.reshape(-1)[offset:offset + out.size]
        return out

    def view(self, blob: Buffer, offset: int, shape, dtype) -> Buffer:
        """The bytes [offset, offset + size) of a uint8 buffer as an array of `shape` and `dtype`."""
        a = _span(blob, offset, shape, dtype)
        h = blob.host[offset:offset + a].view(dtype).reshape(shape)
        return Buffer(h.ctypes.data, tuple(shape), np.dtype(dtype), h, blob.keep)

    def copy_rows(self, cache: Buffer, slot: int, row: int, src: Buffer, index: int, n: int) -> None:
        """src[index] holding [KVH, n, D] contiguously -> cache[slot, :, row:row + n]."""
        kvh, d = cache.shape[1], cache.shape[3]
        start = index * (src.host.size // src.shape[0])
        cache.host[slot, :, row:row + n] = src.host.reshape(-1)[start:start + kvh * n * d].reshape(kvh, n, d)

    def sync(self) -> None:
        pass


class _Allocation:
    """Device memory from cudaMalloc, freed when the last Buffer holding it goes."""

    def __init__(self, cuda, nbytes: int):
        self.cuda, self.ptr = cuda, cuda.malloc(nbytes)

    def __del__(self):
        try:
            self.cuda.free(self.ptr)
        except Exception:  # noqa: BLE001  (interpreter shutdown: the context may be gone already)
            pass


class CudaMemory:
    """Device memory of exactly the size asked (cudaMalloc), copied with the CUDA runtime
    (edgeocr.backends.cudart).  Not ONNX Runtime's allocator: with `OrtValue.ortvalue_from_shape_and_type` the
    KV cache and step buffers (about 390 MiB with a 4,096-token cache) held 512 MiB on the H200 (docs/perf.md §4),
    what an arena that doubles each extension reserves (1 + 2 + ... + 256 MiB); a gigabyte of native-step weights
    could have held two."""

    device = "cuda"

    def __init__(self, ort):
        from edgeocr.backends import cudart

        self.ort = ort
        self.cuda = cudart.load()

    def alloc(self, shape, dtype, zero: bool = True) -> Buffer:
        """zero=False: left as cudaMalloc gives it (for a buffer the caller writes whole at once)."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        a = _Allocation(self.cuda, nbytes)
        buf = Buffer(a.ptr, tuple(shape), np.dtype(dtype), None, a)
        if zero:
            self.cuda.memset(buf.ptr, max(1, buf.nbytes))
        return buf

    def write(self, buf: Buffer, data: np.ndarray, offset: int = 0) -> None:
        src = np.ascontiguousarray(data, buf.dtype)
        _check_span(buf, offset, src.size)
        self.cuda.memcpy_htod(buf.ptr + offset * buf.itemsize, src.ctypes.data, src.nbytes)

    def read(self, buf: Buffer, out: np.ndarray, offset: int = 0) -> np.ndarray:
        _check_span(buf, offset, out.size)
        self.cuda.memcpy_dtoh(out.ctypes.data, buf.ptr + offset * buf.itemsize, out.nbytes)
        return out

    def view(self, blob: Buffer, offset: int, shape, dtype) -> Buffer:
        """The bytes [offset, offset + size) of a uint8 buffer as an array of `shape` and `dtype` (same memory)."""
        _span(blob, offset, shape, dtype)
        return Buffer(blob.ptr + offset, tuple(shape), np.dtype(dtype), None, blob.keep)

    def copy_rows(self, cache: Buffer, slot: int, row: int, src: Buffer, index: int, n: int) -> None:
        """One 2-D copy: KVH runs of n rows; cache pitch = cache_len rows per head, src pitch = n rows."""
        kvh, cache_len, d = cache.shape[1], cache.shape[2], cache.shape[3]
        row_bytes = d * cache.itemsize
        dst = cache.at(slot) + row * row_bytes
        self.cuda.memcpy2d(dst, cache_len * row_bytes, src.at(index), n * row_bytes, n * row_bytes, kvh)

    def sync(self) -> None:
        """Wait for the copies issued here (CUDA's default stream), not for the whole device: a page's vision
        graph may be running on its session's own stream meanwhile (edgeocr.slots, vision ahead)."""
        self.cuda.stream_sync(0)
