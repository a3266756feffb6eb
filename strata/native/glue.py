"""Decoder glue in native code (native/glue.c): the float32 steps between a decode step's matrix
products, one call each instead of a dozen small torch ops.

    native.rmsnorm(x, weight, eps, out)                     # [T, D] or per head [T, H, hd]
    native.rope(q, cos, sin, rope_dim, neox)                # in place, q may be a column slice
    native.kv_write(k, v, k_cache, v_cache, slots, positions)
    native.attn_decode(q, k_cache, v_cache, slots, n_ctx, scale, out)
    native.route(logits, k, "softmax", norm, scale, expert_ids, weights)
    n_used = native.group_assignments(expert_ids, weights, n_experts, used, offsets, token_ids, weights_sorted)

Arguments are CPU torch tensors: float32 for values, int64 for slots, positions and expert ids,
int32 for the grouped outputs. Outputs are passed in (allocated once by the caller); these
wrappers allocate nothing per call and check only what C cannot (dtype, device, layout, shapes);
C checks every index. No policy here about when to use them: that is the models' business.
"""
from __future__ import annotations

import threading
from typing import Any

from ._lib import check, ffi, impl_code, lib

_DTYPES: dict[str, Any] = {}
_cell = threading.local()  # one int64_t out-cell per thread, for group_assignments' count


def _dtype(name: str) -> Any:
    if not _DTYPES:  # torch only when a caller already uses it
        import torch
        _DTYPES.update(float32=torch.float32, int64=torch.int64, int32=torch.int32)
    return _DTYPES[name]


def _bad(t: Any, what: str, dtype: str, layout: str) -> ValueError:
    return ValueError(f"{what} must be a CPU {dtype} tensor {layout}, found {getattr(t, 'dtype', type(t).__name__)} "
                      f"of shape {tuple(getattr(t, 'shape', ()))} and strides {t.stride() if hasattr(t, 'stride') else ()}"
                      f" on {getattr(t, 'device', '?')}")


def _flat(t: Any, what: str, dtype: str, ctype: str) -> Any:
    """Pointer of a contiguous CPU tensor of `dtype`."""
    if getattr(t, "dtype", None) is not _dtype(dtype) or not t.is_contiguous() or t.is_cuda:
        raise _bad(t, what, dtype, "(contiguous)")
    return ffi.cast(ctype, t.data_ptr())


def _rows(t: Any, what: str, ndim: int) -> tuple[Any, int]:
    """(pointer, token stride) of a float32 CPU tensor of `ndim` dims whose dims after the first are
    packed (a column slice of a wider row-major matrix is fine)."""
    if getattr(t, "dtype", None) is not _dtype("float32") or t.dim() != ndim or t.is_cuda:
        raise _bad(t, what, "float32", f"of {ndim} dims")
    st = t.stride()
    if st[-1] != 1 or (ndim == 3 and st[1] != t.shape[2]):
        raise _bad(t, what, "float32", "with packed rows")
    return ffi.cast("float *", t.data_ptr()), st[0]


def rmsnorm(x: Any, weight: Any, eps: float, out: Any) -> Any:
    """out = weight * x / sqrt(mean(x^2) + eps) over the last dim of x [T, D] or [T, H, hd]
    (per head: Qwen3's q/k norm); weight [D] or [hd]; out contiguous like x, or x itself.
    Returns out."""
    xp, xs = _rows(x, "rmsnorm x", x.dim() if x.dim() in (2, 3) else 2)
    op, os_ = _rows(out, "rmsnorm out", x.dim())
    n = x.shape[-1]
    if out.shape != x.shape or weight.shape != (n,):
        raise ValueError(f"rmsnorm: x {tuple(x.shape)}, weight {tuple(weight.shape)}, out {tuple(out.shape)} "
                         f"(expected weight [{n}] and out shaped like x)")
    groups = x.shape[1] if x.dim() == 3 else 1
    status = lib.strata_glue_rmsnorm(xp, xs, x.shape[0], groups, n, _flat(weight, "rmsnorm weight", "float32", "float *"),
                                     eps, op, os_)
    if status:
        check(status, f"rmsnorm of {tuple(x.shape)} (strides {x.stride()})")
    return out


def rope(x: Any, cos: Any, sin: Any, rope_dim: int, neox: bool) -> Any:
    """Rotate x [T, H, hd] in place by cos/sin [T, rope_dim/2] as strata.models.rope.Rope.apply
    does (neox: halves; else adjacent pairs; features past rope_dim untouched). x may be a column
    slice of a wider matrix (token stride free, heads packed). Returns x."""
    xp, xs = _rows(x, "rope x", 3)
    half = rope_dim // 2
    if cos.shape != (x.shape[0], half) or sin.shape != cos.shape:
        raise ValueError(f"rope: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must be [{x.shape[0]}, {half}]")
    status = lib.strata_glue_rope(xp, xs, x.shape[0], x.shape[1], x.shape[2], _flat(cos, "rope cos", "float32", "float *"),
                                  _flat(sin, "rope sin", "float32", "float *"), rope_dim, 1 if neox else 0)
    if status:
        check(status, f"rope of {tuple(x.shape)} with rope_dim {rope_dim}")
    return x


def _cache(k_cache: Any, v_cache: Any, what: str) -> tuple[Any, Any]:
    kp = _flat(k_cache, f"{what} k_cache", "float32", "float *")
    vp = _flat(v_cache, f"{what} v_cache", "float32", "float *")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(f"{what}: caches must both be [S, Hkv, C, hd], found {tuple(k_cache.shape)} "
                         f"and {tuple(v_cache.shape)}")
    return kp, vp


def kv_write(k: Any, v: Any, k_cache: Any, v_cache: Any, slots: Any, positions: Any) -> None:
    """k_cache[slots[t], :, positions[t]] = k[t] (and v alike) for k, v [T, Hkv, hd] (token
    stride free), caches [S, Hkv, C, hd], slots and positions int64 [T]."""
    kcp, vcp = _cache(k_cache, v_cache, "kv_write")
    kp, ks = _rows(k, "kv_write k", 3)
    vp, vs = _rows(v, "kv_write v", 3)
    S, Hkv, C, hd = k_cache.shape
    T = k.shape[0]
    if k.shape != (T, Hkv, hd) or v.shape != k.shape or slots.shape != (T,) or positions.shape != (T,):
        raise ValueError(f"kv_write: k {tuple(k.shape)}, v {tuple(v.shape)}, slots {tuple(slots.shape)}, positions "
                         f"{tuple(positions.shape)} do not fit caches {tuple(k_cache.shape)}")
    status = lib.strata_glue_kv_write(kp, ks, vp, vs, T, Hkv, hd, kcp, vcp, S, C,
                                      _flat(slots, "kv_write slots", "int64", "int64_t *"),
                                      _flat(positions, "kv_write positions", "int64", "int64_t *"))
    if status:
        check(status, f"kv_write of {T} tokens into caches {tuple(k_cache.shape)} (slot or position out of range?)")


def attn_decode(q: Any, k_cache: Any, v_cache: Any, slots: Any, n_ctx: Any, scale: float, out: Any,
                impl: str = "auto") -> Any:
    """Decode attention: out[b] [H*hd] = softmax(scale q[b] K^T) V over cached positions
    0..n_ctx[b]-1 of slot slots[b], head h reading kv head h // (H / Hkv). q [B, H, hd] (token
    stride free), caches [S, Hkv, C, hd], slots and n_ctx int64 [B], out float32 [B, H*hd]
    (token stride free). Returns out."""
    kcp, vcp = _cache(k_cache, v_cache, "attn_decode")
    qp, qs = _rows(q, "attn_decode q", 3)
    op, os_ = _rows(out, "attn_decode out", 2)
    S, Hkv, C, hd = k_cache.shape
    B, H = q.shape[0], q.shape[1]
    if q.shape[2] != hd or out.shape != (B, H * hd) or slots.shape != (B,) or n_ctx.shape != (B,):
        raise ValueError(f"attn_decode: q {tuple(q.shape)}, out {tuple(out.shape)}, slots {tuple(slots.shape)}, "
                         f"n_ctx {tuple(n_ctx.shape)} do not fit caches {tuple(k_cache.shape)}")
    status = lib.strata_glue_attn_decode(qp, qs, B, H, Hkv, hd, kcp, vcp, S, C,
                                         _flat(slots, "attn_decode slots", "int64", "int64_t *"),
                                         _flat(n_ctx, "attn_decode n_ctx", "int64", "int64_t *"), scale, op, os_,
                                         impl_code(impl))
    if status:
        check(status, f"decode attention of q {tuple(q.shape)} over caches {tuple(k_cache.shape)} "
                      f"(H must be a multiple of Hkv; slots in [0, {S}); n_ctx in [1, {C}])")
    return out


_GATING = {"softmax": lib.STRATA_GATING_SOFTMAX, "sigmoid": lib.STRATA_GATING_SIGMOID}


def route(logits: Any, k: int, gating: str, norm: bool, scale: float, expert_ids: Any, weights: Any) -> None:
    """Router on logits [T, E] float32: probabilities (softmax, or sigmoid), the k largest per
    token descending (equal values: lower expert id first) into expert_ids int64 [T, k] and
    weights float32 [T, k], renormalised to sum 1 when norm, times scale."""
    g = _GATING.get(gating)
    if g is None:
        raise ValueError(f"expert gating function {gating!r} is not supported (expected softmax or sigmoid)")
    lp = _flat(logits, "route logits", "float32", "float *")
    T, E = logits.shape
    if expert_ids.shape != (T, k) or weights.shape != (T, k):
        raise ValueError(f"route: expert_ids {tuple(expert_ids.shape)} and weights {tuple(weights.shape)} "
                         f"must be [{T}, {k}]")
    status = lib.strata_glue_route(lp, T, E, k, g, 1 if norm else 0, scale,
                                   _flat(expert_ids, "route expert_ids", "int64", "int64_t *"),
                                   _flat(weights, "route weights", "float32", "float *"))
    if status:
        check(status, f"route of logits {tuple(logits.shape)}, top-{k} (k <= E <= 4096, finite logits)")


def group_assignments(expert_ids: Any, weights: Any, n_experts: int, used: Any, offsets: Any, token_ids: Any,
                      weights_sorted: Any) -> int:
    """Sort the T*K assignments of expert_ids int64 [T, K] (weights float32 [T, K]) by expert,
    stably: returns n, the number of experts used; used int32 [E] gets them ascending in [0, n),
    offsets int64 [E+1] their bounds in [0, n] (used[j] owns entries offsets[j]..offsets[j+1]-1),
    token_ids int32 and weights_sorted float32 [T*K] each entry's token and weight. The same
    values as numpy's stable argsort / unique / order // K."""
    ip = _flat(expert_ids, "group expert_ids", "int64", "int64_t *")
    T, K = expert_ids.shape
    if (weights.shape != (T, K) or used.shape != (n_experts,) or offsets.shape != (n_experts + 1,)
            or token_ids.shape != (T * K,) or weights_sorted.shape != (T * K,)):
        raise ValueError(f"group_assignments: expert_ids {tuple(expert_ids.shape)}, weights {tuple(weights.shape)}, "
                         f"used {tuple(used.shape)}, offsets {tuple(offsets.shape)}, token_ids "
                         f"{tuple(token_ids.shape)}, weights_sorted {tuple(weights_sorted.shape)} (E = {n_experts})")
    cell = getattr(_cell, "n", None)
    if cell is None:
        cell = _cell.n = ffi.new("int64_t *")
    status = lib.strata_glue_group(ip, _flat(weights, "group weights", "float32", "float *"), T, K, n_experts,
                                   _flat(used, "group used", "int32", "int32_t *"),
                                   _flat(offsets, "group offsets", "int64", "int64_t *"),
                                   _flat(token_ids, "group token_ids", "int32", "int32_t *"),
                                   _flat(weights_sorted, "group weights_sorted", "float32", "float *"), cell)
    if status:
        check(status, f"group_assignments of expert ids {tuple(expert_ids.shape)} (ids must lie in [0, {n_experts}))")
    return int(cell[0])


__all__ = ["attn_decode", "group_assignments", "kv_write", "rmsnorm", "rope", "route"]
