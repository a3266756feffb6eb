"""The cffi handle of the C runtime (`strata._native`) and the helpers every wrapper shares.

The only module that imports `ffi`/`lib`; the wrappers beside it (`dequant`, `quantize`, `pager`)
import them from here. It holds no state of its own: `check` turns a status into an exception,
the `*_view` helpers turn a buffer (numpy, torch, bytes-like) into a pointer and a length after
checking what the C side cannot (device, contiguity, dtype, writability).
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from strata.errors import NativeError

try:
    from strata._native import ffi, lib
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise ImportError(
        "strata's native runtime is not built: reinstall with `pip install -e .` "
        f"(needs a C compiler) [{exc}]"
    ) from exc

IMPLS = {"auto": lib.STRATA_IMPL_AUTO, "scalar": lib.STRATA_IMPL_SCALAR, "avx2": lib.STRATA_IMPL_AVX2,
         "avx512": lib.STRATA_IMPL_AVX512}
_IMPL_NAMES = {code: name for name, code in IMPLS.items()}


def status_reason(status: int) -> str:
    """English text of any status the runtime returns (core and pager codes alike)."""
    return ffi.string(lib.strata_pager_status_string(status)).decode()


def check(status: int, what: str, error: type[NativeError] = NativeError) -> None:
    """Raise `error` naming `what` and the reason unless `status` is STRATA_OK."""
    if status != lib.STRATA_OK:
        raise error(f"{what}: {status_reason(status)} (status {status})")


def impl_code(impl: str) -> int:
    """The STRATA_IMPL_* code of 'auto', 'scalar', 'avx2' or 'avx512'."""
    try:
        return IMPLS[impl]
    except KeyError:
        raise ValueError(f"unknown implementation {impl!r}; expected one of {sorted(IMPLS)}") from None


def cpu_has_avx2() -> bool:
    """True when this CPU runs the AVX2 kernels (AVX2, FMA, F16C)."""
    return bool(lib.strata_cpu_has_avx2())


def cpu_has_avx512() -> bool:
    """True when this CPU runs the AVX-512 kernels (AVX-512 F, BW, VL, VNNI on top of the AVX2 set)."""
    return bool(lib.strata_cpu_has_avx512())


def cpu_has_avx512_vbmi() -> bool:
    """True when this CPU also has AVX-512 VBMI and GFNI (the grid i-quants' in-register decode tiles)."""
    return bool(lib.strata_cpu_has_avx512_vbmi())


def cpu_fast_gathers() -> bool:
    """True when this CPU's gathers run at the load ports' rate (not slowed by the Gather Data Sampling
    mitigation, not a Zen 4): with VBMI and GFNI, the grid i-quants' AVX-512 decode tiles."""
    return bool(lib.strata_cpu_fast_gathers())


def cpu_fast_ymm_gathers() -> bool:
    """True when the grid i-quants' AVX2 kernels gather their grid rows (an Intel CPU not affected by
    Gather Data Sampling; STRATA_KERNEL's +ymm_gathers/-ymm_gathers override the choice, not this)."""
    return bool(lib.strata_cpu_fast_ymm_gathers())


def cpu_avx_vnni() -> bool:
    """True when this CPU has AVX-VNNI beside AVX2: the AVX2 family decodes TQ1_0 with VEX-encoded
    VPDPBUSD (native/kernels/avx2/qdot_tq1_avxvnni.c) and runs the grid i-quants' tiles built with it
    (qdot_iq_avxvnni.c), unless STRATA_KERNEL says -avx_vnni (which leaves this detection as it is)."""
    return bool(lib.strata_cpu_avx_vnni())


def cpu_splits_512() -> bool:
    """True when this CPU runs 512-bit operations as two 256-bit halves (AMD family 19h, Zen 4)."""
    return bool(lib.strata_cpu_splits_512())


def impl_name(code: int) -> str | None:
    """The name of a STRATA_IMPL_* code ('scalar', 'avx2', 'avx512'); None for any other (-1: none)."""
    return _IMPL_NAMES.get(code)


def default_impl() -> str:
    """What 'auto' resolves to here: 'avx512', 'avx2' or 'scalar', the widest the CPU runs, capped by
    STRATA_KERNEL=scalar or STRATA_KERNEL=avx2 (read once per process)."""
    return impl_name(lib.strata_impl_default())


def default_threads() -> int:
    """Threads available to this process (its CPU affinity)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def check_threads(n_threads: Any) -> int:
    if isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1:
        raise ValueError(f"n_threads must be a positive integer, found {n_threads!r}")
    return n_threads


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "data_ptr") and hasattr(x, "is_contiguous")


def src_view(src: Any) -> tuple[Any, int]:
    """(cdata pointer, byte length) of a contiguous byte source: bytes-like, numpy or CPU torch."""
    if _is_tensor(src):
        if src.device.type != "cpu":
            raise ValueError(f"source tensor must be on the CPU, found {src.device}")
        if not src.is_contiguous():
            raise ValueError("source tensor must be contiguous")
        return ffi.cast("const void *", src.data_ptr()), src.numel() * src.element_size()
    if isinstance(src, np.ndarray) and not src.flags.c_contiguous:
        raise ValueError("source array must be C-contiguous")
    buf = ffi.from_buffer(src)
    return buf, len(buf)


def dst_view(dst: Any, what: str = "destination") -> tuple[Any, int]:
    """(cdata pointer, byte length) of a writable contiguous destination: a numpy array, a CPU
    (possibly pinned) torch tensor, or any writable buffer (bytearray, mmap, memoryview)."""
    if _is_tensor(dst):
        if dst.device.type != "cpu" or not dst.is_contiguous():
            raise ValueError(f"{what} tensor must be contiguous in host memory, found {dst.device}"
                             f"{'' if dst.is_contiguous() else ' (not contiguous)'}")
        return ffi.cast("void *", dst.data_ptr()), dst.numel() * dst.element_size()
    if isinstance(dst, np.ndarray) and not (dst.flags.c_contiguous and dst.flags.writeable):
        raise ValueError(f"{what} array must be C-contiguous and writeable")
    try:
        buf = ffi.from_buffer(dst, require_writable=True)
    except (TypeError, BufferError) as exc:
        raise TypeError(f"{what} must be a writable buffer, found {type(dst).__name__}: {exc}") from None
    return buf, len(buf)


def f32_view(src: Any) -> tuple[Any, int, tuple[int, ...]]:
    """(cdata float pointer, byte length, shape) of a contiguous float32 numpy array or CPU tensor."""
    if _is_tensor(src):
        if str(src.dtype) != "torch.float32":
            raise ValueError(f"source tensor must be float32, found {src.dtype}")
        if src.device.type != "cpu":
            raise ValueError(f"source tensor must be on the CPU, found {src.device}")
        if not src.is_contiguous():
            raise ValueError("source tensor must be contiguous")
        return ffi.cast("const float *", src.data_ptr()), src.numel() * 4, tuple(src.shape)
    if not isinstance(src, np.ndarray):
        raise TypeError(f"source must be a numpy array or a torch tensor, found {type(src).__name__}")
    if src.dtype != np.float32 or not src.flags.c_contiguous:
        raise ValueError(f"source array must be C-contiguous float32, found {src.dtype}"
                         f"{'' if src.flags.c_contiguous else ' (not contiguous)'}")
    return ffi.cast("const float *", ffi.from_buffer(src)), src.nbytes, src.shape


# Per-call argument types: numpy dtype, torch dtype name and the cffi array type of the pointer.
_CTYPES = {"float *": (np.dtype(np.float32), "torch.float32", "float[]"),
           "int32_t *": (np.dtype(np.int32), "torch.int32", "int32_t[]"),
           "int64_t *": (np.dtype(np.int64), "torch.int64", "int64_t[]")}


def typed_view(a: Any, ctype: str, what: str, writable: bool = False) -> tuple[Any, int, tuple[int, ...]]:
    """(typed pointer, bytes, shape) of a contiguous CPU numpy array or torch tensor whose element
    type is `ctype`. The per-call fast path: one buffer request (which also refuses non-contiguous
    and, when asked, read-only arrays) and no string formatting unless the argument is wrong."""
    np_dtype, torch_dtype, array_type = _CTYPES[ctype]
    if type(a) is np.ndarray:
        if a.dtype != np_dtype:
            raise ValueError(f"{what} must be a {np_dtype} array, found {a.dtype}")
        try:
            return ffi.from_buffer(array_type, a, require_writable=writable), a.nbytes, a.shape
        except (BufferError, ValueError) as exc:
            raise ValueError(f"{what}: {exc}") from None
    if hasattr(a, "data_ptr"):
        if str(a.dtype) != torch_dtype or a.device.type != "cpu" or not a.is_contiguous():
            raise ValueError(f"{what} must be a contiguous CPU {torch_dtype} tensor, found {a.dtype} on {a.device}"
                             f"{'' if a.is_contiguous() else ' (not contiguous)'}")
        return ffi.cast(ctype, a.data_ptr()), a.numel() * a.element_size(), tuple(a.shape)
    if isinstance(a, np.ndarray):                 # a subclass: take the plain array view
        return typed_view(a.view(np.ndarray), ctype, what, writable)
    raise TypeError(f"{what} must be a numpy array or a torch tensor, found {type(a).__name__}")



__all__ = ["IMPLS", "check", "check_threads", "cpu_has_avx2", "cpu_has_avx512", "cpu_has_avx512_vbmi", "cpu_fast_gathers", "cpu_fast_ymm_gathers", "cpu_avx_vnni", "cpu_splits_512", "default_impl", "default_threads",
           "dst_view", "f32_view", "ffi", "impl_code", "lib", "src_view", "status_reason", "typed_view"]
