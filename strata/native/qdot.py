"""Quantized matrix kernels (native/kernels/), their choice per CPU, and single-threaded test entry points.

`select` names the tile a call runs (a tile kind of strata/quant_table.py), read from the table of
quant types against a CPU description (`cpu()`: this process's, STRATA_KERNEL applied; or a made-up
one, to test the choice for CPUs this machine is not). `qdot_rows` computes y[T, N] = x[T, K] @ W[N, K]^T straight from W's packed GGML blocks, with x
rounded to 8-bit activation blocks first (as llama.cpp's CPU backend does); `quantize_act` returns
those rounded activation rows. For tests and measurements: the engine uses the pooled matmul.
Allocates only the arrays it returns and the activation scratch; no file access.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from strata.quant import ggml_type
from strata.quant_table import BY_NAME, CPU_FEATURES, TILE_KINDS, kinds_of

from ._lib import _is_tensor, check, f32_view, ffi, impl_code, lib, src_view
from .dequant import row_geometry

KINDS = tuple(TILE_KINDS)
VENDORS = ("other", "intel", "amd")
#: The tile kind of each family's own tiles.
OWN_KIND = {"scalar": "ref", "avx2": "avx2", "avx512": "avx512"}


class CpuDesc(NamedTuple):
    """A CPU as the kernel choice sees it: vendor ('intel', 'amd', 'other'), family (base plus
    extended: 0x19 Zen 3/4, 0x1A Zen 5), features (names of CPU_FEATURES), and the tile kinds
    STRATA_KERNEL prefers (+kind) and rules out (-kind)."""
    vendor: str
    family: int
    features: frozenset[str]
    prefer: frozenset[str] = frozenset()
    exclude: frozenset[str] = frozenset()


def _bits(names, order) -> int:
    unknown = set(names) - set(order)
    if unknown:
        raise ValueError(f"unknown names {sorted(unknown)}; expected some of {list(order)}")
    return sum(1 << order.index(n) for n in names)


def _names(bits: int, order) -> frozenset[str]:
    return frozenset(n for i, n in enumerate(order) if bits >> i & 1)


def cpu() -> CpuDesc:
    """This process's CPU description (STRATA_KERNEL applied); ValueError naming the variable when it
    holds a word the runtime does not know."""
    d = ffi.new("strata_cpu_desc *")
    status = lib.strata_cpu_describe(d)
    desc = CpuDesc(VENDORS[d.vendor], d.family, _names(d.features, CPU_FEATURES), _names(d.prefer, KINDS),
                   _names(d.exclude, KINDS))
    if status != lib.STRATA_OK:
        raise ValueError(f"STRATA_KERNEL: a word that is not a family, a +/-tile kind ({', '.join(KINDS)}) "
                         f"or a +/-gather choice; read as {desc}")
    return desc


def _cdesc(desc: CpuDesc):
    d = ffi.new("strata_cpu_desc *")
    d.vendor, d.family = VENDORS.index(desc.vendor), desc.family
    d.features, d.prefer, d.exclude = (_bits(desc.features, CPU_FEATURES), _bits(desc.prefer, KINDS),
                                       _bits(desc.exclude, KINDS))
    return d


def select(t: Any, impl: str = "auto", n_tokens: int = 1, cpu: CpuDesc | None = None) -> str:
    """The tile kind a call of family `impl` runs for type `t` and `n_tokens` tokens (fewer than 4:
    decode), on CPU `cpu` (None: this one)."""
    kind = lib.strata_qdot_select(int(ggml_type(t)), impl_code(impl), _cdesc(cpu) if cpu else ffi.NULL, n_tokens)
    if kind < 0:
        raise ValueError(f"{ggml_type(t).name}: no packed kernel for {impl!r} on {cpu or 'this CPU'}")
    return KINDS[kind]


def _tokens_view(x: Any, row_len: int) -> tuple[Any, int, int]:
    """(float pointer, byte length, n_tokens) of x [T, K] (or [K]) float32, checked against K."""
    x_ptr, x_bytes, shape = f32_view(x)
    if len(shape) not in (1, 2) or shape[-1] != row_len:
        raise ValueError(f"activations must have shape [T, {row_len}] or [{row_len}], found {list(shape)}")
    return x_ptr, x_bytes, (shape[0] if len(shape) == 2 else 1)


def has_qdot_kernel(t: Any, impl: str) -> bool:
    """True when family `impl` has tiles of its own for type `t` (the table names its own kind)."""
    return OWN_KIND[impl] in kinds_of(BY_NAME[ggml_type(t).name]) if ggml_type(t).name in BY_NAME else False


def kernel_family(t: Any, impl: str, decode: bool) -> str:
    """The family whose tile a call of family `impl` runs for type `t`: for decode (fewer than 4
    tokens; an AVX-512 call may decode with the AVX2 build, where the table says it is faster) or
    prefill."""
    return TILE_KINDS[select(t, impl, 1 if decode else 4)].family


def scratch_bytes(t: Any, n_tokens: int, row_len: int) -> int:
    """Bytes of rounded activations `qdot_rows` keeps for n_tokens rows of row_len values."""
    t = ggml_type(t)
    out = ffi.new("int64_t *")
    check(lib.strata_qdot_scratch_bytes(int(t), n_tokens, row_len, out), f"qdot scratch size of {t.name}")
    return int(out[0])


def qdot_rows(t: Any, w: Any, n_rows: int, row_len: int, x: Any, *, impl: str = "auto", tile: str | None = None) -> Any:
    """y [T, n_rows] float32 = x [T, row_len] @ W^T, W being n_rows packed rows of type `t` in `w`
    (bytes-like, numpy or CPU torch), by the tile the table picks for `impl`, or by the tile of kind
    `tile` whatever the token count. Returns a torch tensor when x is one, else a numpy array."""
    t = ggml_type(t)
    w_ptr, w_bytes = src_view(w)
    _, _, need = row_geometry(t, (n_rows, row_len), f"weight [{n_rows}, {row_len}]")
    if w_bytes < need:
        raise ValueError(f"{t.name}: weight [{n_rows}, {row_len}] needs {need} packed bytes, found {w_bytes}")
    x_ptr, x_bytes, n_tokens = _tokens_view(x, row_len)
    y = np.empty((n_tokens, n_rows), dtype=np.float32)
    scratch = np.empty(max(scratch_bytes(t, n_tokens, row_len), 1), dtype=np.uint8)
    y_ptr = ffi.cast("float *", ffi.from_buffer(y, require_writable=True))
    s_ptr = ffi.from_buffer(scratch, require_writable=True)
    if tile is None:
        status = lib.strata_qdot_rows(int(t), w_ptr, w_bytes, n_rows, row_len, x_ptr, x_bytes, n_tokens, y_ptr,
                                      y.nbytes, s_ptr, scratch.nbytes, impl_code(impl))
    else:
        status = lib.strata_qdot_tile_rows(int(t), KINDS.index(tile), w_ptr, w_bytes, n_rows, row_len, x_ptr, x_bytes,
                                           n_tokens, y_ptr, y.nbytes, s_ptr, scratch.nbytes)
    check(status, f"qdot {t.name} weight [{n_rows}, {row_len}] x activations [{n_tokens}, {row_len}]"
                  f"{f' by its {tile} tile' if tile else ''}")
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


__all__ = ["CpuDesc", "KINDS", "cpu", "has_qdot_kernel", "kernel_family", "qdot_rows", "quantize_act", "scratch_bytes",
           "select"]
