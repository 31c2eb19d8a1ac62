"""Minimal CUDA runtime calls through ctypes (no torch, no cupy, no pycuda).

Used by the ONNX Runtime CUDA session (2-D copies of new KV rows into the static cache) and by the
TensorRT session (allocation, a stream, async copies, CUDA-graph capture and replay).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys

from edgeocr.errors import BackendError

_MEMCPY_H2D = 1   # cudaMemcpyHostToDevice
_MEMCPY_D2H = 2   # cudaMemcpyDeviceToHost
_MEMCPY_D2D = 3   # cudaMemcpyDeviceToDevice
_CAPTURE_THREAD_LOCAL = 1   # cudaStreamCaptureModeThreadLocal
_STREAM_NON_BLOCKING = 1    # cudaStreamNonBlocking
_LIMIT_STACK = 0            # cudaLimitStackSize


class CudaRT:
    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.cudaMemcpy2D.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                     ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
        lib.cudaMemcpy2D.restype = ctypes.c_int
        lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.cudaMemcpy.restype = ctypes.c_int
        lib.cudaDeviceSynchronize.restype = ctypes.c_int
        lib.cudaMemGetInfo.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]

    def memcpy2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int) -> None:
        rc = self.lib.cudaMemcpy2D(dst, dpitch, src, spitch, width, height, _MEMCPY_D2D)
        if rc != 0:
            raise BackendError(f"cudaMemcpy2D failed with CUDA error {rc}")

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise BackendError(f"{what} failed with CUDA error {rc}")

    def malloc(self, nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        self._check(self.lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(max(1, nbytes))), f"cudaMalloc({nbytes})")
        return int(ptr.value)

    def free(self, ptr: int) -> None:
        self._check(self.lib.cudaFree(ctypes.c_void_p(ptr)), "cudaFree")

    def memset(self, ptr: int, nbytes: int) -> None:
        self._check(self.lib.cudaMemset(ctypes.c_void_p(ptr), 0, ctypes.c_size_t(nbytes)), "cudaMemset")

    def stream_create(self, non_blocking: bool = False) -> int:
        s = ctypes.c_void_p()
        if non_blocking:     # does not wait for (nor make wait) CUDA's legacy default stream
            self._check(self.lib.cudaStreamCreateWithFlags(ctypes.byref(s), ctypes.c_uint(_STREAM_NON_BLOCKING)),
                        "cudaStreamCreateWithFlags")
        else:
            self._check(self.lib.cudaStreamCreate(ctypes.byref(s)), "cudaStreamCreate")
        return int(s.value)

    def make_current(self, device: int = 0) -> None:
        """The device's primary context current on this thread (what the driver API launches into); cudaFree(0)
        initializes it where cudaSetDevice alone does not (CUDA 11)."""
        self._check(self.lib.cudaSetDevice(device), "cudaSetDevice")
        self._check(self.lib.cudaFree(ctypes.c_void_p(0)), "cudaFree(0)")

    def stream_priority_range(self) -> tuple[int, int]:
        """(lowest, highest) stream priority of the current device; a lower number is a higher priority
        (0 and -5 on recent GPUs)."""
        least, greatest = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.cudaDeviceGetStreamPriorityRange(ctypes.byref(least), ctypes.byref(greatest)),
                    "cudaDeviceGetStreamPriorityRange")
        return least.value, greatest.value

    def stream_create_with_priority(self, priority: int) -> int:
        """A non-blocking stream (it does not wait for CUDA's legacy default stream, as ONNX Runtime's own
        streams do not) whose kernels the GPU schedules before those of lower-priority streams."""
        s = ctypes.c_void_p()
        self._check(self.lib.cudaStreamCreateWithPriority(ctypes.byref(s), ctypes.c_uint(_STREAM_NON_BLOCKING),
                                                          ctypes.c_int(priority)), "cudaStreamCreateWithPriority")
        return int(s.value)

    def stream_sync(self, stream: int) -> None:
        self._check(self.lib.cudaStreamSynchronize(ctypes.c_void_p(stream)), "cudaStreamSynchronize")

    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: str, stream: int) -> None:
        k = {"htod": _MEMCPY_H2D, "dtoh": _MEMCPY_D2H, "dtod": _MEMCPY_D2D}[kind]
        self._check(self.lib.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), ctypes.c_size_t(nbytes),
                                             k, ctypes.c_void_p(stream)), f"cudaMemcpyAsync {kind}")

    def memcpy2d_async(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int,
                       stream: int) -> None:
        self._check(self.lib.cudaMemcpy2DAsync(ctypes.c_void_p(dst), ctypes.c_size_t(dpitch), ctypes.c_void_p(src),
                                               ctypes.c_size_t(spitch), ctypes.c_size_t(width),
                                               ctypes.c_size_t(height), _MEMCPY_D2D, ctypes.c_void_p(stream)),
                    "cudaMemcpy2DAsync")

    def host_alloc(self, nbytes: int) -> int:
        """Pinned host memory (async copies from pageable memory are staged synchronously)."""
        ptr = ctypes.c_void_p()
        self._check(self.lib.cudaMallocHost(ctypes.byref(ptr), ctypes.c_size_t(max(1, nbytes))), "cudaMallocHost")
        return int(ptr.value)

    def graph_capture_begin(self, stream: int) -> None:
        self._check(self.lib.cudaStreamBeginCapture(ctypes.c_void_p(stream), _CAPTURE_THREAD_LOCAL),
                    "cudaStreamBeginCapture")

    def graph_capture_end(self, stream: int) -> int:
        """End the capture and instantiate it; returns the executable graph."""
        graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self.lib.cudaStreamEndCapture(ctypes.c_void_p(stream), ctypes.byref(graph)), "cudaStreamEndCapture")
        # the flags form: one signature from CUDA 11.4 (JetPack 5) on; cudaGraphInstantiate's changed in CUDA 12
        self._check(self.lib.cudaGraphInstantiateWithFlags(ctypes.byref(exe), graph, ctypes.c_ulonglong(0)),
                    "cudaGraphInstantiateWithFlags")
        return int(exe.value)

    def graph_launch(self, exe: int, stream: int) -> None:
        self._check(self.lib.cudaGraphLaunch(ctypes.c_void_p(exe), ctypes.c_void_p(stream)), "cudaGraphLaunch")

    def memcpy_htod(self, dst: int, src: int, nbytes: int) -> None:
        self._check(self.lib.cudaMemcpy(dst, src, nbytes, _MEMCPY_H2D), "cudaMemcpy (host to device)")

    def memcpy_dtod(self, dst: int, src: int, nbytes: int) -> None:
        self._check(self.lib.cudaMemcpy(dst, src, nbytes, _MEMCPY_D2D), "cudaMemcpy (device to device)")

    def stack_limit(self) -> int:
        """The current device's per-thread stack size (cudaLimitStackSize), bytes."""
        out = ctypes.c_size_t()
        self._check(self.lib.cudaDeviceGetLimit(ctypes.byref(out), _LIMIT_STACK), "cudaDeviceGetLimit")
        return out.value

    def set_stack_limit(self, nbytes: int) -> None:
        """Set the current device's per-thread stack size; the driver grows it again for a kernel that needs more."""
        self._check(self.lib.cudaDeviceSetLimit(_LIMIT_STACK, ctypes.c_size_t(nbytes)), "cudaDeviceSetLimit")

    def memcpy_dtoh(self, dst: int, src: int, nbytes: int) -> None:
        self._check(self.lib.cudaMemcpy(dst, src, nbytes, _MEMCPY_D2H), "cudaMemcpy (device to host)")

    def sync(self) -> None:
        rc = self.lib.cudaDeviceSynchronize()
        if rc != 0:
            raise BackendError(f"cudaDeviceSynchronize failed with CUDA error {rc}")

    def device_info(self, device: int = 0) -> dict:
        """{"name", "compute_capability"} of `device`; raises BackendError when there is no GPU."""
        major, minor = ctypes.c_int(), ctypes.c_int()
        for attr, out in ((75, major), (76, minor)):     # cudaDevAttrComputeCapabilityMajor / Minor
            rc = self.lib.cudaDeviceGetAttribute(ctypes.byref(out), attr, device)
            if rc != 0:
                raise BackendError(f"no CUDA device {device} (CUDA error {rc})")
        name = "unknown"
        try:                                                # the name comes from the driver API
            drv = ctypes.CDLL("libcuda.so.1")
            buf = ctypes.create_string_buffer(256)
            dev = ctypes.c_int()
            if drv.cuInit(0) == 0 and drv.cuDeviceGet(ctypes.byref(dev), device) == 0 \
                    and drv.cuDeviceGetName(buf, 256, dev) == 0:
                name = buf.value.decode(errors="replace")
        except OSError:
            pass
        return {"name": name, "compute_capability": f"{major.value}.{minor.value}"}

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value


def _candidates() -> list[str]:
    names = [ctypes.util.find_library("cudart")] if ctypes.util.find_library("cudart") else []
    names += ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    for base in sys.path:
        for pat in ("nvidia/cu13/lib/libcudart.so*", "nvidia/cuda_runtime/lib/libcudart.so*",
                    "nvidia/cu12/lib/libcudart.so*", "nvidia/*/lib/libcudart.so*"):
            names += sorted(glob.glob(os.path.join(base, pat)))
    names += sorted(glob.glob("/usr/local/cuda*/lib64/libcudart.so*"))
    return names


_CACHED: CudaRT | None = None


def load() -> CudaRT:
    global _CACHED
    if _CACHED is not None:
        return _CACHED
    errors = []
    for name in _candidates():
        try:
            _CACHED = CudaRT(ctypes.CDLL(name))
            return _CACHED
        except OSError as e:
            errors.append(f"{name}: {e}")
    raise BackendError("CUDA runtime library (libcudart) not found; install the CUDA runtime "
                       "(pip install nvidia-cuda-runtime) or JetPack. Tried: " + "; ".join(errors[:4]))
