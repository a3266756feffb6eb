"""Dequantization (native/dequant*.c): packed GGML blocks into float32/float16/bfloat16 rows.

Wrappers check dtype, contiguity, sizes and block multiples in Python so the C code is only called
with consistent arguments; the call releases the GIL. No file access and no allocation beyond the
output array `dequantize` returns.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from strata.quant import DEQUANT_TYPES, GGMLType, block_size, ggml_type

from ._lib import check, check_threads, f32_view, ffi, impl_code, lib, src_view

_OUT_NUMPY = {np.dtype(np.float32): lib.STRATA_OUT_F32, np.dtype(np.float16): lib.STRATA_OUT_F16}
_OUT_TORCH_NAMES = {"torch.float32": lib.STRATA_OUT_F32, "torch.float16": lib.STRATA_OUT_F16,
                    "torch.bfloat16": lib.STRATA_OUT_BF16}


def has_kernel(t: Any, impl: str) -> bool:
    """True when `impl` has its own kernel for type `t` (else that format runs its scalar kernel)."""
    return bool(lib.strata_dequant_has_kernel(int(ggml_type(t)), impl_code(impl)))


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


def row_geometry(t: GGMLType, shape: tuple[int, ...], what: str) -> tuple[int, int, int]:
    """(row_len, n_rows, packed bytes) of a row-major `shape` of type `t`; the last dimension is
    the row and must hold whole blocks."""
    row_len = int(shape[-1]) if shape else 1
    n_elems = int(np.prod(shape)) if shape else 1
    elems, nbytes = block_size(t)
    if row_len % elems:
        raise ValueError(f"{t.name}: row length {row_len} of {what} is not a multiple of the block size {elems}")
    return row_len, (n_elems // row_len if row_len else 0), n_elems // elems * nbytes


def dequantize_into(t: Any, src: Any, out: Any, *, n_threads: int = 1, impl: str = "auto") -> Any:
    """Dequantize packed `src` of ggml type `t` into `out` (numpy float32/float16 array or CPU
    torch float32/float16/bfloat16 tensor), without copies.

    `out`'s last dimension is the row length and must be a multiple of the type's block size; the
    source must hold at least as many packed bytes as `out` has elements. Returns `out`.
    """
    t = ggml_type(t)
    if t not in DEQUANT_TYPES:
        raise ValueError(f"dequantization of {t.name} is not supported")
    check_threads(n_threads)
    src_ptr, src_bytes = src_view(src)
    dst_ptr, dst_bytes, out_code, shape, desc = _out_view(out)
    row_len, n_rows, need = row_geometry(t, shape, f"output {desc}")
    if src_bytes < need:
        raise ValueError(f"{t.name}: output {desc} needs {need} packed bytes, source holds {src_bytes}")
    status = lib.strata_dequant(int(t), src_ptr, src_bytes, dst_ptr, dst_bytes, out_code,
                                n_rows, row_len, n_threads, impl_code(impl))
    check(status, f"dequantize {t.name} into {desc}")
    return out


def dequantize_rows(t: Any, src: Any, ids: Any, out: Any, *, impl: str = "auto") -> Any:
    """Rows `ids` (ints) of the packed matrix `src` of type `t`, whose rows are `out`'s row length
    long, dequantized into float32 `out` [len(ids), row] (CPU torch or numpy), row i from row
    ids[i]: an embedding lookup, one native call per row and no view per row. Returns out."""
    t = ggml_type(t)
    if t not in DEQUANT_TYPES:
        raise ValueError(f"dequantization of {t.name} is not supported")
    src_ptr, src_bytes = src_view(src)
    dst_ptr, dst_bytes, out_code, shape, desc = _out_view(out)
    if out_code != lib.STRATA_OUT_F32 or len(shape) != 2 or shape[0] != len(ids):
        raise ValueError(f"dequantize_rows: output {desc} must be float32 [{len(ids)}, row]")
    row_len, _, row_bytes = row_geometry(t, (1, shape[1]), f"output {desc}")
    n_rows, code = src_bytes // row_bytes, impl_code(impl)
    base, dst = ffi.cast("const uint8_t *", src_ptr), ffi.cast("uint8_t *", dst_ptr)
    for i, r in enumerate(ids):
        if not 0 <= r < n_rows:
            raise IndexError(f"row {r} of a {n_rows}-row {t.name} matrix")
        check(lib.strata_dequant(int(t), base + r * row_bytes, row_bytes, dst + i * row_len * 4, row_len * 4,
                                 out_code, 1, row_len, 1, code), f"dequantize row {r} of {t.name} into {desc}")
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
    src_ptr, _, _ = f32_view(src)
    dst_ptr, dst_bytes, out_code, shape, desc = _out_view(out)
    n = int(np.prod(shape)) if shape else 1
    if n != src.size:
        raise ValueError(f"output {desc} has {n} elements, source has {src.size}")
    check(lib.strata_convert_f32(src_ptr, dst_ptr, n, out_code, impl_code(impl)), f"convert float32 into {desc}")
    return out


__all__ = ["convert_f32_into", "dequantize", "dequantize_into", "dequantize_rows", "has_kernel", "row_geometry"]
