"""Thin wrappers over the C runtime (`strata._native`). The only module that touches ffi/lib.

Every wrapper checks its inputs in Python (dtype, contiguity, sizes, block multiples) so that the
C code is only ever called with consistent arguments, then turns a non-zero status into
`NativeError`. The C calls release the GIL (cffi API mode), so threads overlap with Python.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from strata.errors import NativeError
from strata.quant import DEQUANT_TYPES, GGMLType, block_size, ggml_type

try:
    from strata._native import ffi, lib
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise ImportError(
        "strata's native runtime is not built: reinstall with `pip install -e .` "
        f"(needs a C compiler) [{exc}]"
    ) from exc

IMPLS = {"auto": lib.STRATA_IMPL_AUTO, "scalar": lib.STRATA_IMPL_SCALAR, "avx2": lib.STRATA_IMPL_AVX2}

_OUT_NUMPY = {np.dtype(np.float32): lib.STRATA_OUT_F32, np.dtype(np.float16): lib.STRATA_OUT_F16}
_OUT_TORCH_NAMES = {"torch.float32": lib.STRATA_OUT_F32, "torch.float16": lib.STRATA_OUT_F16,
                    "torch.bfloat16": lib.STRATA_OUT_BF16}


def _check(status: int, what: str) -> None:
    if status != lib.STRATA_OK:
        raise NativeError(f"{what}: {ffi.string(lib.strata_status_string(status)).decode()} (status {status})")


def cpu_has_avx2() -> bool:
    """True when this CPU runs the AVX2 kernels (AVX2, FMA, F16C)."""
    return bool(lib.strata_cpu_has_avx2())


def default_impl() -> str:
    """What 'auto' resolves to here: 'avx2', or 'scalar' (no AVX2, or STRATA_FORCE_SCALAR set)."""
    return "avx2" if lib.strata_impl_default() == lib.STRATA_IMPL_AVX2 else "scalar"


def has_kernel(t: Any, impl: str) -> bool:
    """True when `impl` has its own kernel for type `t` (else that format runs its scalar kernel)."""
    return bool(lib.strata_dequant_has_kernel(int(ggml_type(t)), _impl(impl)))


def default_threads() -> int:
    """Threads available to this process (its CPU affinity)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _impl(impl: str) -> int:
    try:
        return IMPLS[impl]
    except KeyError:
        raise ValueError(f"unknown implementation {impl!r}; expected one of {sorted(IMPLS)}") from None


def _src_view(src: Any) -> tuple[Any, int]:
    """(cdata pointer, byte length) of a contiguous byte source: bytes-like, numpy or CPU torch."""
    if hasattr(src, "data_ptr") and hasattr(src, "is_contiguous"):  # torch.Tensor
        if src.device.type != "cpu":
            raise ValueError(f"source tensor must be on the CPU, found {src.device}")
        if not src.is_contiguous():
            raise ValueError("source tensor must be contiguous")
        return ffi.cast("const void *", src.data_ptr()), src.numel() * src.element_size()
    if isinstance(src, np.ndarray) and not src.flags.c_contiguous:
        raise ValueError("source array must be C-contiguous")
    buf = ffi.from_buffer(src)
    return buf, len(buf)


def _out_view(out: Any) -> tuple[Any, int, int, tuple[int, ...], str]:
    """(cdata pointer, byte length, STRATA_OUT_*, shape, description) of an output buffer."""
    if hasattr(out, "data_ptr") and hasattr(out, "is_contiguous"):  # torch.Tensor
        code = _OUT_TORCH_NAMES.get(str(out.dtype))
        if code is None:
            raise ValueError(f"output tensor dtype must be float32, float16 or bfloat16, found {out.dtype}")
        if out.device.type != "cpu":
            raise ValueError(f"output tensor must be on the CPU, found {out.device}")
        if not out.is_contiguous():
            raise ValueError("output tensor must be contiguous")
        return (ffi.cast("void *", out.data_ptr()), out.numel() * out.element_size(), code,
                tuple(out.shape), f"tensor {tuple(out.shape)} {out.dtype}")
    if isinstance(out, np.ndarray):
        code = _OUT_NUMPY.get(out.dtype)
        if code is None:
            raise ValueError(f"output array dtype must be float32 or float16, found {out.dtype}")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("output array must be C-contiguous and writeable")
        return ffi.from_buffer(out, require_writable=True), out.nbytes, code, out.shape, f"array {out.shape} {out.dtype}"
    raise TypeError(f"output must be a numpy array or a torch tensor, found {type(out).__name__}")


def dequantize_into(t: Any, src: Any, out: Any, *, n_threads: int = 1, impl: str = "auto") -> Any:
    """Dequantize packed `src` of ggml type `t` into `out` (numpy float32/float16 array or CPU
    torch float32/float16/bfloat16 tensor), without copies.

    `out`'s last dimension is the row length and must be a multiple of the type's block size; the
    source must hold at least as many packed bytes as `out` has elements. Returns `out`.
    """
    t = ggml_type(t)
    if t not in DEQUANT_TYPES:
        raise ValueError(f"dequantization of {t.name} is not supported")
    if not isinstance(n_threads, int) or n_threads < 1:
        raise ValueError(f"n_threads must be a positive integer, found {n_threads!r}")
    src_ptr, src_bytes = _src_view(src)
    dst_ptr, dst_bytes, out_code, shape, desc = _out_view(out)
    row_len = int(shape[-1]) if shape else 1
    n_elems = int(np.prod(shape)) if shape else 1
    n_rows = n_elems // row_len if row_len else 0
    elems, nbytes = block_size(t)
    if row_len % elems:
        raise ValueError(f"{t.name}: row length {row_len} of output {desc} is not a multiple of the block size {elems}")
    need = n_elems // elems * nbytes
    if src_bytes < need:
        raise ValueError(f"{t.name}: output {desc} needs {need} packed bytes, source holds {src_bytes}")
    status = lib.strata_dequant(int(t), src_ptr, src_bytes, dst_ptr, dst_bytes, out_code,
                                n_rows, row_len, n_threads, _impl(impl))
    _check(status, f"dequantize {t.name} into {desc}")
    return out


def dequantize(t: Any, src: Any, shape: tuple[int, ...] | int, *, dtype: Any = np.float32,
               n_threads: int = 1, impl: str = "auto") -> np.ndarray:
    """Dequantize into a new numpy array of `shape` (row-major, last dimension = row length)."""
    out = np.empty(shape, dtype=dtype)
    return dequantize_into(t, src, out, n_threads=n_threads, impl=impl)


def convert_f32_into(src: np.ndarray, out: Any, *, impl: str = "auto") -> Any:
    """Round float32 `src` into float16/bfloat16 `out` (same element count), nearest-even."""
    if not isinstance(src, np.ndarray) or src.dtype != np.float32 or not src.flags.c_contiguous:
        raise ValueError("source must be a C-contiguous float32 numpy array")
    dst_ptr, dst_bytes, out_code, shape, desc = _out_view(out)
    n = int(np.prod(shape)) if shape else 1
    if n != src.size:
        raise ValueError(f"output {desc} has {n} elements, source has {src.size}")
    _check(lib.strata_convert_f32(ffi.cast("const float *", ffi.from_buffer(src)), dst_ptr, n, out_code, _impl(impl)),
           f"convert float32 into {desc}")
    return out


# ---------------------------------------------------------------------------------------------
# Quantization (native/quantize.c): float32 rows -> packed GGML blocks, for the converter.
# ---------------------------------------------------------------------------------------------

def can_quantize(t: Any) -> bool:
    """True when the native runtime quantizes into type `t` (Q8_0, Q4_K, Q6_K)."""
    return bool(lib.strata_quantize_has_type(int(ggml_type(t))))


def _f32_view(src: Any) -> tuple[Any, int, tuple[int, ...]]:
    """(cdata float pointer, byte length, shape) of a contiguous float32 numpy array or CPU tensor."""
    if hasattr(src, "data_ptr") and hasattr(src, "is_contiguous"):  # torch.Tensor
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


def quantize_into(t: Any, src: Any, out: Any, *, n_threads: int = 1, impl: str = "auto") -> Any:
    """Quantize float32 `src` (last dimension = row length, a multiple of the block size) into
    `out`, a writable contiguous byte buffer (numpy array, bytearray, memoryview) holding at least
    the packed size. Returns `out`."""
    t = ggml_type(t)
    if not can_quantize(t):
        raise ValueError(f"quantization into {t.name} is not supported natively")
    if not isinstance(n_threads, int) or n_threads < 1:
        raise ValueError(f"n_threads must be a positive integer, found {n_threads!r}")
    src_ptr, src_bytes, shape = _f32_view(src)
    row_len = int(shape[-1]) if shape else 1
    n_elems = int(np.prod(shape)) if shape else 1
    n_rows = n_elems // row_len if row_len else 0
    elems, nbytes = block_size(t)
    if row_len % elems:
        raise ValueError(f"{t.name}: row length {row_len} of source {shape} is not a multiple of the block size {elems}")
    if isinstance(out, np.ndarray) and not out.flags.c_contiguous:
        raise ValueError("output array must be C-contiguous")
    dst = ffi.from_buffer(out, require_writable=True)
    need = n_elems // elems * nbytes
    if len(dst) < need:
        raise ValueError(f"{t.name}: source {shape} packs into {need} bytes, output holds {len(dst)}")
    status = lib.strata_quantize(int(t), src_ptr, src_bytes, dst, len(dst), n_rows, row_len, n_threads, _impl(impl))
    _check(status, f"quantize {shape} float32 into {t.name}")
    return out


def quantize(t: Any, src: Any, *, n_threads: int = 1, impl: str = "auto") -> np.ndarray:
    """Quantize float32 `src` into a new uint8 array of shape (*src.shape[:-1], packed row bytes)."""
    t = ggml_type(t)
    _, _, shape = _f32_view(src)
    elems, nbytes = block_size(t)
    row_len = int(shape[-1]) if shape else 1
    if row_len % elems:
        raise ValueError(f"{t.name}: row length {row_len} of source {shape} is not a multiple of the block size {elems}")
    out = np.empty((*shape[:-1], row_len // elems * nbytes), dtype=np.uint8)
    return quantize_into(t, src, out, n_threads=n_threads, impl=impl)
