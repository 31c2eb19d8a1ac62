"""CUDA C++ compiled at run time by NVRTC and launched through the driver API, through ctypes (no torch, no CUDA
headers): the native decode step's kernels (edgeocr/kernels/*.cu) on whatever GPU the runtime finds.

NVRTC comes with the CUDA toolkit, or as the `nvidia-cuda-nvrtc` wheel (onnxruntime-gpu's CUDA extras and CUDA
torch bring it); the driver library (libcuda.so.1) with the NVIDIA driver.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from pathlib import Path

from edgeocr.errors import BackendError

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
HEADERS = ("half.cuh", "decode_gemv.cu", "decode_gemv_tc.cu", "decode_attention.cu", "decode_step.cu")


def driver_version() -> int:
    """The CUDA version the driver supports (12020 = 12.2); 0 without a driver."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    v = ctypes.c_int()
    return v.value if cu.cuDriverGetVersion(ctypes.byref(v)) == 0 else 0


def _nvrtc_candidates() -> list[str]:
    # a cubin from an NVRTC newer than the driver does not load: CUDA 13's only on a CUDA 13 driver
    drv = driver_version()
    new_ok = drv == 0 or drv >= 13000
    pats = (["nvidia/cu13/lib/libnvrtc.so*"] if new_ok else []) + ["nvidia/cuda_nvrtc/lib/libnvrtc.so*",
                                                                    "nvidia/cu12/lib/libnvrtc.so*"]
    names = []
    for base in sys.path:
        for pat in pats + ["nvidia/*/lib/libnvrtc.so*"]:        # wheels lay CUDA's libraries out differently
            names += sorted(glob.glob(os.path.join(base, pat)))
    if not new_ok:
        names = [n for n in names if "libnvrtc.so.13" not in n and "/cu13/" not in n]
    found = ctypes.util.find_library("nvrtc")
    names += ([found] if found else []) + (["libnvrtc.so.13"] if new_ok else []) + ["libnvrtc.so.12", "libnvrtc.so"]
    names += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    # libnvrtc-builtins and the alt variants are not the compiler
    return [n for n in names if "builtins" not in os.path.basename(n) and "alt" not in os.path.basename(n)]


def _load_nvrtc() -> ctypes.CDLL:
    errors = []
    for name in _nvrtc_candidates():
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(f"{name}: {e}")
    raise BackendError("NVRTC (libnvrtc) not found: the native decode step compiles its kernels at load; "
                       "pip install nvidia-cuda-nvrtc-cu12 (or the CUDA toolkit). Tried: " + "; ".join(errors[:4]))


def compile_cubin(source: str, arch: str, defines: dict[str, int] | None = None, name: str = "edgeocr.cu") -> bytes:
    """`source` (which may #include the files of edgeocr/kernels) compiled for `arch` (e.g. "sm_90") with
    -D defines; a compile error raises with NVRTC's log."""
    return _compile(source, arch, defines, name, ptx=False)


def compile_ptx(source: str, arch: str, defines: dict[str, int] | None = None, name: str = "edgeocr.cu") -> str:
    """The same compiled to PTX for the virtual architecture of `arch` ("sm_90" -> compute_90): the kernels'
    instructions as text (tests read it)."""
    return _compile(source, arch.replace("sm_", "compute_"), defines, name, ptx=True).rstrip(b"\0").decode()


def _compile(source: str, arch: str, defines: dict[str, int] | None, name: str, ptx: bool) -> bytes:
    lib = _load_nvrtc()
    prog = ctypes.c_void_p()
    texts = [(KERNELS / h).read_bytes() for h in HEADERS]
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), len(HEADERS),
                                (ctypes.c_char_p * len(HEADERS))(*texts),
                                (ctypes.c_char_p * len(HEADERS))(*[h.encode() for h in HEADERS]))
    if rc:
        raise BackendError(f"nvrtcCreateProgram: error {rc}")
    opts = [f"--gpu-architecture={arch}", "--std=c++17", "-lineinfo"]
    opts += [f"-D{k}={v}" for k, v in (defines or {}).items()]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        raise BackendError(f"NVRTC could not compile {name} for {arch}:\n{log.value.decode(errors='replace')}")
    kind = "PTX" if ptx else "CUBIN"
    getattr(lib, f"nvrtcGet{kind}Size")(prog, ctypes.byref(size))
    out = ctypes.create_string_buffer(size.value)
    rc = getattr(lib, f"nvrtcGet{kind}")(prog, out)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    if rc:
        raise BackendError(f"nvrtcGet{kind}: error {rc}")
    return out.raw


LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6      # CUlaunchAttributeID (cuda.h)


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: the id, padding to 8 bytes, then the 64-byte value union (its first int here)."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig: grid and block dimensions, dynamic shared memory, stream, attributes."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


class Module:
    """Compiled kernels loaded into the current CUDA context (the primary context ONNX Runtime and the CUDA
    runtime use), launched on a given stream."""

    def __init__(self, cubin: bytes, names):
        try:
            self.cu = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise BackendError(f"the CUDA driver library (libcuda.so.1) is not loadable: {e}") from None
        self.cu.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [
            ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        # cuLaunchKernelEx (programmatic dependent launch) came with CUDA 11.8's driver; older ones lack it
        self._launch_ex = getattr(self.cu, "cuLaunchKernelEx", None)
        if self._launch_ex is not None:
            self._launch_ex.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_void_p]
        mod = ctypes.c_void_p()
        rc = self.cu.cuModuleLoadData(ctypes.byref(mod), cubin)
        if rc:
            raise BackendError(f"the CUDA driver could not load the compiled kernels (cuModuleLoadData error {rc}; "
                               f"driver supports CUDA {driver_version() / 1000:g}: an NVRTC newer than the driver "
                               "compiles code it cannot load)")
        self.mod, self.fns = mod, {}
        for n in names:
            fn = ctypes.c_void_p()
            self._check(self.cu.cuModuleGetFunction(ctypes.byref(fn), mod, n.encode()), f"cuModuleGetFunction({n})")
            self.fns[n] = fn

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc:
            raise BackendError(f"{what} failed with CUDA driver error {rc}")

    def launch(self, name: str, grid, block, stream: int, args: list, pdl: bool = False) -> None:
        """args: ctypes values (c_void_p for pointers, c_int, c_float, ...), in the kernel's order.  pdl: launched
        with programmatic stream serialization (sm_90 and later; the kernel must wait with griddepcontrol.wait
        before it touches what the kernel before it wrote: half.cuh's STEP_ENTRY)."""
        params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
        g = tuple(grid) + (1,) * (3 - len(grid))
        b = tuple(block) + (1,) * (3 - len(block))
        if not pdl:
            self._check(self.cu.cuLaunchKernel(self.fns[name], *g, *b, 0, ctypes.c_void_p(stream), params, None),
                        f"cuLaunchKernel({name})")
            return
        if self._launch_ex is None:
            raise BackendError("the CUDA driver has no cuLaunchKernelEx (it needs CUDA 11.8 or later) for "
                               "programmatic dependent launch")
        attr = LaunchAttribute(id=LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        attr.value[0] = 1                            # programmaticStreamSerializationAllowed
        cfg = LaunchConfig(grid=(ctypes.c_uint * 3)(*g), block=(ctypes.c_uint * 3)(*b), shared_bytes=0,
                           stream=stream, attrs=ctypes.pointer(attr), num_attrs=1)
        self._check(self._launch_ex(ctypes.byref(cfg), self.fns[name], params, None), f"cuLaunchKernelEx({name})")


def device_arch(device: int = 0) -> tuple[str, int]:
    """("sm_XY", multiprocessor count) of `device`, through the driver API."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise BackendError(f"the CUDA driver library (libcuda.so.1) is not loadable: {e}") from None
    dev = ctypes.c_int()
    if cu.cuInit(0) or cu.cuDeviceGet(ctypes.byref(dev), device):
        raise BackendError(f"no CUDA device {device}")
    vals = []
    for attr in (75, 76, 16):   # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / MINOR, MULTIPROCESSOR_COUNT
        v = ctypes.c_int()
        if cu.cuDeviceGetAttribute(ctypes.byref(v), attr, dev):
            raise BackendError(f"cuDeviceGetAttribute({attr}) failed on device {device}")
        vals.append(v.value)
    return f"sm_{vals[0]}{vals[1]}", vals[2]
