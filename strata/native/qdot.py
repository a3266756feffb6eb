"""Quantized matrix kernels (native/qdot*.c), single-threaded test entry points.

`qdot_rows` computes y[T, N] = x[T, K] @ W[N, K]^T straight from W's packed GGML blocks, with x
rounded to 8-bit activation blocks first (as llama.cpp's CPU backend does); `quantize_act` returns
those rounded activation rows. For tests and measurements: the engine uses the pooled matmul.
Allocates only the arrays it returns and the activation scratch; no file access.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from strata.quant import ggml_type

from ._lib import _is_tensor, check, f32_view, ffi, impl_code, impl_name, lib, src_view
from .dequant import row_geometry


def _tokens_view(x: Any, row_len: int) -> tuple[Any, int, int]:
    """(float pointer, byte length, n_tokens) of x [T, K] (or [K]) float32, checked against K."""
    x_ptr, x_bytes, shape = f32_view(x)
    if len(shape) not in (1, 2) or shape[-1] != row_len:
        raise ValueError(f"activations must have shape [T, {row_len}] or [{row_len}], found {list(shape)}")
    return x_ptr, x_bytes, (shape[0] if len(shape) == 2 else 1)


def has_qdot_kernel(t: Any, impl: str) -> bool:
    """True when `impl` has its own tile kernel for type `t` (else the format runs the scalar one)."""
    return bool(lib.strata_qdot_has_kernel(int(ggml_type(t)), impl_code(impl)))


def kernel_family(t: Any, impl: str, decode: bool) -> str:
    """The family whose tile a call of family `impl` runs for type `t`: for decode (fewer than 4
    tokens; an AVX-512 call may decode with the AVX2 tile, where the kernel table measured it
    faster) or prefill."""
    name = impl_name(lib.strata_qdot_kernel_family(int(ggml_type(t)), impl_code(impl), int(decode)))
    if name is None:
        raise ValueError(f"{ggml_type(t).name}: no packed kernel for {impl!r}")
    return name


def avx_vnni_tile(t: Any, impl: str, decode: bool) -> bool:
    """True when a call of family `impl` for type `t` runs an AVX-VNNI tile of the AVX2 family (on a
    CPU with AVX-VNNI: TQ1_0's decode, the grid i-quants' tiles), for decode or prefill."""
    code = lib.strata_qdot_avx_vnni_tile(int(ggml_type(t)), impl_code(impl), int(decode))
    if code < 0:
        raise ValueError(f"{ggml_type(t).name}: no packed kernel for {impl!r}")
    return bool(code)


def scratch_bytes(t: Any, n_tokens: int, row_len: int) -> int:
    """Bytes of rounded activations `qdot_rows` keeps for n_tokens rows of row_len values."""
    t = ggml_type(t)
    out = ffi.new("int64_t *")
    check(lib.strata_qdot_scratch_bytes(int(t), n_tokens, row_len, out), f"qdot scratch size of {t.name}")
    return int(out[0])


def qdot_rows(t: Any, w: Any, n_rows: int, row_len: int, x: Any, *, impl: str = "auto") -> Any:
    """y [T, n_rows] float32 = x [T, row_len] @ W^T, W being n_rows packed rows of type `t` in `w`
    (bytes-like, numpy or CPU torch). Returns a torch tensor when x is one, else a numpy array."""
    t = ggml_type(t)
    w_ptr, w_bytes = src_view(w)
    _, _, need = row_geometry(t, (n_rows, row_len), f"weight [{n_rows}, {row_len}]")
    if w_bytes < need:
        raise ValueError(f"{t.name}: weight [{n_rows}, {row_len}] needs {need} packed bytes, found {w_bytes}")
    x_ptr, x_bytes, n_tokens = _tokens_view(x, row_len)
    y = np.empty((n_tokens, n_rows), dtype=np.float32)
    scratch = np.empty(max(scratch_bytes(t, n_tokens, row_len), 1), dtype=np.uint8)
    status = lib.strata_qdot_rows(int(t), w_ptr, w_bytes, n_rows, row_len, x_ptr, x_bytes, n_tokens,
                                  ffi.cast("float *", ffi.from_buffer(y, require_writable=True)), y.nbytes,
                                  ffi.from_buffer(scratch, require_writable=True), scratch.nbytes, impl_code(impl))
    check(status, f"qdot {t.name} weight [{n_rows}, {row_len}] x activations [{n_tokens}, {row_len}]")
    if _is_tensor(x):
        import torch  # only when the caller already uses torch

        return torch.from_numpy(y)
    return y


def quantize_act(t: Any, x: Any, *, impl: str = "auto") -> np.ndarray:
    """The activation rows `qdot_rows` computes for weight type `t`: uint8 [T, bytes per row]
    (the 8-bit block layout of native/qdot.h; float32 bytes for F32/F16/BF16 weights)."""
    t = ggml_type(t)
    row_len = int(x.shape[-1])
    x_ptr, x_bytes, n_tokens = _tokens_view(x, row_len)
    per_row = scratch_bytes(t, 1, row_len) or 4 * row_len
    out = np.empty((n_tokens, per_row), dtype=np.uint8)
    status = lib.strata_qdot_quantize_act(int(t), x_ptr, x_bytes, n_tokens, row_len,
                                          ffi.from_buffer(out, require_writable=True), out.nbytes, impl_code(impl))
    check(status, f"quantize activations [{n_tokens}, {row_len}] for {t.name}")
    return out


__all__ = ["avx_vnni_tile", "has_qdot_kernel", "qdot_rows", "quantize_act", "scratch_bytes"]
