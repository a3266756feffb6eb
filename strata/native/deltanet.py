"""Gated DeltaNet in native code (native/deltanet.c): the short causal convolution and the gated
delta rule of one sequence, for the CPU path of `strata.models.deltanet`.

    native.deltanet_conv(x, weight, conv_state, out)        # x, out [n, C]; state [K-1, C] moves on
    native.deltanet_recur(mixed, g, beta, ssm_state, out, n_k_heads, tiled)   # out [n, Hv, dv]
    native.deltanet_gates(b, a, dt, A, beta, g)             # b, a -> beta, g [n, Hv]
    native.deltanet_norm_gate(o, z, norm, eps, out)         # rmsnorm(o) * norm * silu(z): out [n, Hv dv]
    native.attn_gate(x, gate)                               # x *= sigmoid(gate): gated attention
    (the decode step of a layer: strata.models.executor.deltanet.DecodeDeltaNet, on deltanet.c)

Arguments are contiguous float32 CPU torch tensors (z may be a row-strided view); C checks every
size against its buffer.
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


def deltanet_gates(b: Any, a: Any, dt: Any, A: Any, beta: Any, g: Any) -> tuple[Any, Any]:
    """beta = sigmoid(b), g = softplus(a + dt) * A for b, a [n, Hv] and dt, A [Hv] (into beta, g [n, Hv])."""
    n, Hv = b.shape
    bp, bn = _ptr(b, "b")
    ap, an = _ptr(a, "a")
    dp, dn = _ptr(dt, "dt")
    Ap, An = _ptr(A, "A")
    betap, betan = _ptr(beta, "beta")
    gp, gn = _ptr(g, "g")
    if an != bn or An != dn or gn != betan:
        raise ValueError(f"deltanet gates: b {tuple(b.shape)}, a {tuple(a.shape)}, dt {tuple(dt.shape)}, "
                         f"A {tuple(A.shape)}, beta {tuple(beta.shape)}, g {tuple(g.shape)} differ")
    status = lib.strata_deltanet_gates(bp, ap, bn, n, Hv, dp, Ap, dn, betap, gp, gn)
    check(status, f"deltanet gates of b {tuple(b.shape)}, dt {tuple(dt.shape)}")
    return beta, g


def deltanet_norm_gate(o: Any, z: Any, norm: Any, eps: float, out: Any) -> Any:
    """out [n, Hv dv] = rmsnorm(o [n, Hv, dv]) * norm [dv] * silu(z [n, Hv dv], rows may be strided)."""
    n, Hv, dv = o.shape
    if z.dim() != 2 or z.shape[0] != n or z.stride(1) != 1 or z.dtype is not torch_float32() or z.is_cuda:
        raise ValueError(f"deltanet norm gate: z must be float32 CPU rows [{n}, {Hv * dv}] of unit stride, "
                         f"found {z.dtype} {tuple(z.shape)} strides {z.stride()}")
    z_len = 0 if n == 0 else (n - 1) * z.stride(0) + z.shape[1]
    status = lib.strata_deltanet_norm_gate(*_ptr(o, "o"), n, Hv, dv, ffi.cast("float *", z.data_ptr()), z.stride(0),
                                           z_len, *_ptr(norm, "norm"), eps, *_ptr(out, "out"))
    check(status, f"deltanet norm gate of o {tuple(o.shape)}, z {tuple(z.shape)}, norm {tuple(norm.shape)}")
    return out


def attn_gate(x: Any, gate: Any) -> Any:
    """x *= sigmoid(gate) in place (gated attention's output gate), both contiguous float32 of one size."""
    xp, xn = _ptr(x, "x")
    gp, gn = _ptr(gate, "gate")
    if xn != gn:
        raise ValueError(f"attention gate: x {tuple(x.shape)} and gate {tuple(gate.shape)} differ in size")
    check(lib.strata_attn_gate(xp, xn, gp, gn, xn), f"attention gate of x {tuple(x.shape)}")
    return x


def torch_float32() -> Any:
    import torch
    return torch.float32


__all__ = ["attn_gate", "deltanet_conv", "deltanet_gates", "deltanet_norm_gate", "deltanet_recur"]
