"""Calibrated quantization (native/calib.c): importance-weighted block search and GPTQ's grid.

`quantize_weighted` is round-to-nearest's twin with one importance per column; `grid` and
`set_codes` let GPTQ (converters.calib.gptq) pick codes column by column on the scales a block
search chose. Checks shapes in Python, then calls C (GIL released). Opens no files.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from strata.quant import block_size, ggml_type, row_bytes

from ._lib import check, check_threads, f32_view, ffi, lib
from .dequant import row_geometry


def code_max(t: Any) -> int:
    """The largest code of type `t`'s grid (Q8_0 255, Q4_K 15, Q6_K 63)."""
    t = ggml_type(t)
    m = lib.strata_calib_code_max(int(t))
    if m < 0:
        raise ValueError(f"calibrated quantization into {t.name} is not supported (Q8_0, Q4_K, Q6_K)")
    return int(m)


def quantize_weighted(t: Any, src: np.ndarray, importance: np.ndarray, *, n_threads: int = 1) -> np.ndarray:
    """float32 `src` [rows, K] -> packed uint8 [rows, row bytes] of type `t`, each block chosen to
    minimise sum_k importance[k] * (x - x_quantized)^2 (never worse on that measure than
    `native.quantize`). `importance`: K non-negative finite values."""
    t = ggml_type(t)
    code_max(t)
    check_threads(n_threads)
    src = np.ascontiguousarray(src, dtype=np.float32)
    ptr, nbytes, shape = f32_view(src)
    row_len, n_rows, _ = row_geometry(t, shape, f"source {shape}")
    imp = np.ascontiguousarray(importance, dtype=np.float32).reshape(-1)
    if imp.shape[0] != row_len:
        raise ValueError(f"{t.name}: {imp.shape[0]} importances for rows of {row_len} values")
    if not np.all(np.isfinite(imp)) or np.any(imp < 0):
        raise ValueError(f"{t.name}: importances must be finite and non-negative")
    out = np.empty((*shape[:-1], row_bytes(t, row_len)), dtype=np.uint8)
    dst = ffi.from_buffer(out, require_writable=True)
    status = lib.strata_calib_quantize(int(t), ptr, nbytes, ffi.cast("const float *", ffi.from_buffer(imp)),
                                       imp.shape[0], dst, len(dst), n_rows, row_len, n_threads)
    check(status, f"weighted quantize {shape} float32 into {t.name}")
    return out


def grid(t: Any, blocks: np.ndarray, n_elems: int) -> tuple[np.ndarray, np.ndarray]:
    """(step, zero), float32 [n_elems] each, of `n_elems` values packed in `blocks`: element i
    decodes as zero[i] + step[i] * code[i], code in 0..code_max(t)."""
    t = ggml_type(t)
    code_max(t)
    elems, _ = block_size(t)
    blocks = np.ascontiguousarray(blocks, dtype=np.uint8)
    step, zero = np.empty(n_elems, np.float32), np.empty(n_elems, np.float32)
    status = lib.strata_calib_grid(int(t), ffi.from_buffer(blocks), blocks.nbytes, n_elems // elems,
                                   ffi.cast("float *", ffi.from_buffer(step)), ffi.cast("float *", ffi.from_buffer(zero)),
                                   n_elems)
    check(status, f"grid of {n_elems} {t.name} values")
    return step, zero


def set_codes(t: Any, codes: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """Write integer `codes` (float32, one per value) into `blocks` (uint8, modified in place),
    keeping their scales. Returns `blocks`."""
    t = ggml_type(t)
    code_max(t)
    elems, _ = block_size(t)
    codes = np.ascontiguousarray(codes, dtype=np.float32).reshape(-1)
    if not (isinstance(blocks, np.ndarray) and blocks.flags.c_contiguous and blocks.dtype == np.uint8):
        raise ValueError("blocks must be a C-contiguous uint8 array")
    status = lib.strata_calib_set_codes(int(t), ffi.cast("const float *", ffi.from_buffer(codes)), codes.shape[0],
                                        ffi.from_buffer(blocks, require_writable=True), blocks.nbytes,
                                        codes.shape[0] // elems)
    check(status, f"codes of {codes.shape[0]} {t.name} values")
    return blocks





def gptq_block(W: Any, U: Any, step: Any, zero: Any, cmax: int, *, n_threads: int = 1) -> tuple[Any, Any]:
    """GPTQ's column loop over one block (native): W [N, B] float32 torch view (row stride free,
    updated in place), U [B, B] upper factor, step/zero [N, B]. Returns (codes, errors) [N, B]."""
    import torch

    check_threads(n_threads)
    N, B = W.shape
    if W.dtype != torch.float32 or W.stride(1) != 1 or W.device.type != "cpu":
        raise ValueError("W must be a float32 CPU tensor with contiguous rows")
    U, step, zero = (t.contiguous().float() for t in (U, step, zero))
    if U.shape != (B, B) or step.shape != (N, B) or zero.shape != (N, B):
        raise ValueError(f"GPTQ block: W {tuple(W.shape)}, U {tuple(U.shape)}, step {tuple(step.shape)}, "
                         f"zero {tuple(zero.shape)}")
    codes, err = torch.empty((N, B)), torch.empty((N, B))

    def fp(t):
        return ffi.cast("float *", t.data_ptr())

    status = lib.strata_calib_gptq_block(fp(W), N, B, W.stride(0), fp(U), fp(step), fp(zero), cmax, fp(codes),
                                         fp(err), n_threads)
    check(status, f"GPTQ block of {N}x{B}")
    return codes, err
__all__ = ["code_max", "gptq_block", "grid", "quantize_weighted", "set_codes"]
