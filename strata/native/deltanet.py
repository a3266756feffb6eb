"""Gated DeltaNet in native code (native/deltanet.c): the short causal convolution and the gated
delta rule of one sequence, for the CPU path of `strata.models.deltanet`.

    native.deltanet_conv(x, weight, conv_state, out)        # x, out [n, C]; state [K-1, C] moves on
    native.deltanet_recur(mixed, g, beta, ssm_state, out, n_k_heads, tiled)   # out [n, Hv, dv]

Arguments are contiguous float32 CPU torch tensors; C checks every size against its buffer.
"""
from __future__ import annotations

from typing import Any

from ._lib import check, ffi, lib


def _ptr(t: Any, what: str) -> tuple[Any, int]:
    import torch
    if t.dtype is not torch.float32 or t.is_cuda or not t.is_contiguous():
        raise ValueError(f"deltanet: {what} must be a contiguous float32 CPU tensor, found {t.dtype} of shape "
                         f"{tuple(t.shape)} on {t.device}")
    return ffi.cast("float *", t.data_ptr()), t.numel()


def deltanet_conv(x: Any, weight: Any, state: Any, out: Any) -> Any:
    """out = silu(causal depthwise conv of x [n, C] after `state` [K-1, C], weight [C, K]); state moves on."""
    (n, C), K = x.shape, weight.shape[-1]
    status = lib.strata_deltanet_conv(*_ptr(x, "x"), n, C, K, *_ptr(weight, "weight"), *_ptr(state, "conv state"),
                                      *_ptr(out, "out"))
    check(status, f"deltanet conv of x {tuple(x.shape)}, weight {tuple(weight.shape)}, state {tuple(state.shape)}")
    return out


def deltanet_recur(mixed: Any, g: Any, beta: Any, state: Any, out: Any, n_k_heads: int, tiled: bool) -> Any:
    """The gated delta rule over mixed [n, C] (q | k | v) with g, beta [n, Hv] from `state`
    [Hv, dk, dv] (moves on): out [n, Hv, dv]."""
    Hv, dk, dv = state.shape
    gp, gn = _ptr(g, "g")
    bp, bn = _ptr(beta, "beta")
    if gn != bn:
        raise ValueError(f"deltanet: g {tuple(g.shape)} and beta {tuple(beta.shape)} differ")
    status = lib.strata_deltanet_recur(*_ptr(mixed, "mixed"), gp, bp, gn, mixed.shape[0], n_k_heads, Hv, dk, dv,
                                       int(tiled), *_ptr(state, "ssm state"), *_ptr(out, "out"))
    check(status, f"deltanet recurrence of mixed {tuple(mixed.shape)}, state {tuple(state.shape)}, "
                  f"{n_k_heads} key heads")
    return out


__all__ = ["deltanet_conv", "deltanet_recur"]
