"""Quantization (native/quantize*.c): float32 rows into packed GGML blocks, for the converter.

Checks shapes and buffer sizes in Python, then calls the C quantizer (GIL released). Opens no
files; `quantize` allocates only the array it returns.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from strata.quant import ggml_type, row_bytes

from ._lib import check, check_threads, f32_view, ffi, impl_code, lib
from .dequant import row_geometry


def can_quantize(t: Any) -> bool:
    """True when the native runtime quantizes into type `t` (Q8_0, Q2_K, Q4_K, Q6_K)."""
    return bool(lib.strata_quantize_has_type(int(ggml_type(t))))


def quantize_into(t: Any, src: Any, out: Any, *, n_threads: int = 1, impl: str = "auto") -> Any:
    """Quantize float32 `src` (last dimension = row length, a multiple of the block size) into
    `out`, a writable contiguous byte buffer (numpy array, bytearray, memoryview) holding at least
    the packed size. Returns `out`."""
    t = ggml_type(t)
    if not can_quantize(t):
        raise ValueError(f"quantization into {t.name} is not supported natively")
    check_threads(n_threads)
    src_ptr, src_bytes, shape = f32_view(src)
    row_len, n_rows, need = row_geometry(t, shape, f"source {shape}")
    if isinstance(out, np.ndarray) and not out.flags.c_contiguous:
        raise ValueError("output array must be C-contiguous")
    dst = ffi.from_buffer(out, require_writable=True)
    if len(dst) < need:
        raise ValueError(f"{t.name}: source {shape} packs into {need} bytes, output holds {len(dst)}")
    status = lib.strata_quantize(int(t), src_ptr, src_bytes, dst, len(dst), n_rows, row_len, n_threads,
                                 impl_code(impl))
    check(status, f"quantize {shape} float32 into {t.name}")
    return out


def quantize(t: Any, src: Any, *, n_threads: int = 1, impl: str = "auto") -> np.ndarray:
    """Quantize float32 `src` into a new uint8 array of shape (*src.shape[:-1], packed row bytes)."""
    t = ggml_type(t)
    _, _, shape = f32_view(src)
    row_len, _, _ = row_geometry(t, shape, f"source {shape}")
    out = np.empty((*shape[:-1], row_bytes(t, row_len)), dtype=np.uint8)
    return quantize_into(t, src, out, n_threads=n_threads, impl=impl)


__all__ = ["can_quantize", "quantize", "quantize_into"]
