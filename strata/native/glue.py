"""Decoder glue in native code (native/glue.c): the float32 steps between a decode step's matrix
products, one call each instead of a dozen small torch ops.

    native.rmsnorm(x, weight, eps, out)                     # [T, D] or per head [T, H, hd]
    native.rope(q, cos, sin, rope_dim, neox)                # in place, q may be a column slice
    native.kv_write(k, v, k_cache, v_cache, slots, positions)
    native.attn_decode(q, k_cache, v_cache, block_table, n_ctx, scale, out)   # paged cache
    native.matvec(x, router_weight, logits)                 # F32 weights: the router's logits
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

from strata.quant import GGMLType, block_size

from ._lib import IMPLS, check, ffi, impl_code, lib

_F32 = _I64 = _I32 = _U8 = None  # torch dtypes, looked up at the first call (torch only when a caller uses it)
_KV_TYPES: dict = {}  # KV cache tensor dtype -> ggml type of its rows
_Q8_0 = int(GGMLType.Q8_0)
_QK, _Q8_0_BYTES = block_size(GGMLType.Q8_0)  # values and bytes per block
_cell = threading.local()  # one int64_t out-cell per thread, for group_assignments' count


def _init() -> None:
    global _F32, _I64, _I32, _U8, _KV_TYPES
    import torch
    _F32, _I64, _I32, _U8 = torch.float32, torch.int64, torch.int32, torch.uint8
    _KV_TYPES = {torch.float32: int(GGMLType.F32), torch.float16: int(GGMLType.F16), torch.bfloat16: int(GGMLType.BF16), torch.uint8: _Q8_0}


def _bad(t: Any, what: str, dtype: Any, layout: str) -> ValueError:
    found = getattr(t, "dtype", type(t).__name__)
    strides = t.stride() if hasattr(t, "stride") else ()
    return ValueError(f"{what} must be a CPU {dtype} tensor {layout}, found {found} of shape "
                      f"{tuple(getattr(t, 'shape', ()))} and strides {strides} on {getattr(t, 'device', '?')}")


def _flat(t: Any, what: str, dtype: Any, ctype: str) -> Any:
    """Pointer of a contiguous CPU tensor of `dtype` (the per-call path: three attribute reads)."""
    if getattr(t, "dtype", None) is not dtype or t.is_cuda or not t.is_contiguous():
        raise _bad(t, what, dtype, "(contiguous)")
    return ffi.cast(ctype, t.data_ptr())


def _rows(t: Any, what: str, ndim: int) -> tuple[Any, int]:
    """(pointer, token stride) of a float32 CPU tensor of `ndim` dims whose dims after the first are
    packed (a column slice of a wider row-major matrix is fine)."""
    st = t.stride() if getattr(t, "dtype", None) is _F32 and not t.is_cuda else ()
    if len(st) != ndim or st[-1] != 1 or (ndim == 3 and st[1] != t.shape[2]):
        raise _bad(t, what, "float32", f"of {ndim} dims with packed rows")
    return ffi.cast("float *", t.data_ptr()), st[0]


def rmsnorm(x: Any, weight: Any, eps: float, out: Any) -> Any:
    """out = weight * x / sqrt(mean(x^2) + eps) over the last dim of x [T, D] or [T, H, hd]
    (per head: Qwen3's q/k norm); weight [D] or [hd], or None (no weight: Llama 4's L2 q/k norm);
    out like x (token stride free), or x itself.
    Returns out."""
    if _F32 is None:
        _init()
    shape = x.shape
    nd = len(shape)
    xp, xs = _rows(x, "rmsnorm x", 3 if nd == 3 else 2)
    op, os_ = _rows(out, "rmsnorm out", nd)
    if out.shape != shape or (weight is not None and weight.shape != shape[-1:]):
        raise ValueError(f"rmsnorm: x {tuple(shape)}, weight {None if weight is None else tuple(weight.shape)}, "
                         f"out {tuple(out.shape)} "
                         f"(expected weight [{shape[-1]}] and out shaped like x)")
    status = lib.strata_glue_rmsnorm(xp, xs, shape[0], shape[1] if nd == 3 else 1, shape[-1],
                                     ffi.NULL if weight is None else _flat(weight, "rmsnorm weight", _F32, "float *"),
                                     eps, op, os_)
    if status:
        check(status, f"rmsnorm of {tuple(shape)} (strides {x.stride()})")
    return out


def rope(x: Any, cos: Any, sin: Any, rope_dim: int, neox: bool) -> Any:
    """Rotate x [T, H, hd] in place by cos/sin [T, rope_dim/2] as strata.models.rope.Rope.apply
    does (neox: halves; else adjacent pairs; features past rope_dim untouched). x may be a column
    slice of a wider matrix (token stride free, heads packed). Returns x."""
    if _F32 is None:
        _init()
    xp, xs = _rows(x, "rope x", 3)
    T, H, hd = x.shape
    cs = cos.shape
    if len(cs) != 2 or cs[0] != T or 2 * cs[1] != rope_dim or sin.shape != cs:
        raise ValueError(f"rope: cos {tuple(cs)} and sin {tuple(sin.shape)} must be [{T}, {rope_dim // 2}] "
                         f"for rope_dim {rope_dim}")
    status = lib.strata_glue_rope(xp, xs, T, H, hd, _flat(cos, "rope cos", _F32, "float *"),
                                  _flat(sin, "rope sin", _F32, "float *"), rope_dim, 1 if neox else 0)
    if status:
        check(status, f"rope of {tuple(x.shape)} with rope_dim {rope_dim}")
    return x


def gate_softplus(x: Any, gate: Any) -> Any:
    """x [T, G * w] *= softplus(gate [T, G]) in place, each gate value over w consecutive values of
    its token's row (Laguna's output gate: G heads of w = hd, or G = H hd elements of w = 1); both
    contiguous float32. Returns x."""
    if _F32 is None:
        _init()
    T, G = gate.shape if gate.dim() == 2 else (-1, -1)
    if x.dim() != 2 or x.shape[0] != T or G < 1 or x.shape[1] % G:
        raise ValueError(f"softplus gate: x {tuple(x.shape)} must be [T, G * w] for gate {tuple(gate.shape)} [T, G]")
    status = lib.strata_glue_gate_softplus(_flat(x, "gate x", _F32, "float *"), x.numel(),
                                           _flat(gate, "gate", _F32, "float *"), gate.numel(), T, G, x.shape[1] // G)
    if status:
        check(status, f"softplus gate of x {tuple(x.shape)} by {tuple(gate.shape)}")
    return x


def kv_cache_type(cache: Any) -> int:
    """The ggml type of a KV cache tensor's rows, from its dtype: float32 F32, float16 F16,
    bfloat16 BF16, uint8 Q8_0 (rows of hd / 32 blocks of 34 bytes)."""
    if _F32 is None:
        _init()
    kv_type = _KV_TYPES.get(getattr(cache, "dtype", None))
    if kv_type is None:
        raise ValueError(f"KV cache: dtype {getattr(cache, 'dtype', type(cache).__name__)} is none of float32, "
                         f"float16, bfloat16 and uint8 (Q8_0 blocks)")
    return kv_type


def kv_row_bytes(kv_type: int, head_dim: int) -> int:
    """Bytes of one cache row of head_dim values in ggml type kv_type (Q8_0: 34 per 32 values)."""
    if kv_type == _Q8_0:
        return head_dim // _QK * _Q8_0_BYTES
    return head_dim * (4 if kv_type == 0 else 2)


def _cache(t: Any, what: str) -> tuple[Any, int]:
    """(pointer, ggml type) of a contiguous CPU KV cache tensor."""
    kv_type = kv_cache_type(t)
    if t.is_cuda or not t.is_contiguous():
        raise _bad(t, what, t.dtype, "(contiguous)")
    return ffi.cast("void *", t.data_ptr()), kv_type


def kv_write(k: Any, v: Any, k_cache: Any, v_cache: Any, slots: Any, positions: Any, impl: str = "auto") -> None:
    """k_cache[slots[t], :, positions[t]] = k[t] (and v alike) for k, v [T, Hkv, hd] (token
    stride free), caches [S, Hkv, C, row] (float32, float16 or bfloat16 rows of hd, or uint8 rows
    of hd / 32 Q8_0 blocks, quantized here), slots and positions int64 [T]."""
    kcp, kv_type = _cache(k_cache, "kv_write k_cache")
    vcp, v_type = _cache(v_cache, "kv_write v_cache")
    kp, ks = _rows(k, "kv_write k", 3)
    vp, vs = _rows(v, "kv_write v", 3)
    cshape, kshape = k_cache.shape, k.shape
    hd = kshape[2]
    if (len(cshape) != 4 or v_cache.shape != cshape or v_type != kv_type or kshape[1] != cshape[1]
            or cshape[3] != kv_row_bytes(kv_type, hd) // _elem_bytes(kv_type) or v.shape != kshape
            or slots.shape != kshape[:1] or positions.shape != kshape[:1]):
        raise ValueError(f"kv_write: k {tuple(kshape)}, v {tuple(v.shape)}, slots {tuple(slots.shape)}, positions "
                         f"{tuple(positions.shape)} do not fit caches {tuple(cshape)} and {tuple(v_cache.shape)} "
                         f"({k_cache.dtype}, {v_cache.dtype})")
    S, Hkv, C, _ = cshape
    status = lib.strata_glue_kv_write_typed(kv_type, kp, ks, vp, vs, kshape[0], Hkv, hd, kcp, vcp, S, C,
                                            _flat(slots, "kv_write slots", _I64, "int64_t *"),
                                            _flat(positions, "kv_write positions", _I64, "int64_t *"),
                                            IMPLS[impl] if impl in IMPLS else impl_code(impl))
    if status:
        check(status, f"kv_write of {kshape[0]} tokens into caches {tuple(cshape)} (slot or position out of range?)")


def _elem_bytes(kv_type: int) -> int:
    return 1 if kv_type == _Q8_0 else 4 if kv_type == 0 else 2


def attn_decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, n_ctx: Any, scale: float, out: Any,
                impl: str = "auto", sinks: Any = None, window: int = 0, pool: Any = None, chunk: int = 0) -> Any:
    """Decode attention over a paged cache: out[b] [H*hd] = softmax(scale q[b] K^T) V over positions
    0..n_ctx[b]-1 of sequence b, position j in block block_table[b, j // P] at offset j % P, head h
    reading kv head h // (H / Hkv). q [B, H, hd] (token stride free), caches [N, Hkv, P, hd],
    block_table int64 [B, M] (contiguous), n_ctx int64 [B], out float32 [B, H*hd] (token stride
    free). A contiguous cache [S, Hkv, C, hd] is P = C with block_table = slots[:, None].
    gpt-oss: `window` > 0 attends only the last `window` positions; `sinks` float32 [H] adds one
    logit per head to its softmax (a column with no value). `impl`: 'auto', 'scalar', 'avx2' or
    'avx512'. `chunk` > 0 (Llama 4's local layers; no window): each query attends within its own
    chunk of `chunk` positions. `pool` (a ComputePool): the (sequence, head) pairs, or a lone
    sequence's positions, spread over its threads when the work is large enough (the same bytes as
    without). Returns out."""
    if _F32 is None:
        _init()
    kcp, kv_type = _cache(k_cache, "attn_decode k_cache")
    vcp, v_type = _cache(v_cache, "attn_decode v_cache")
    qp, qs = _rows(q, "attn_decode q", 3)
    op, os_ = _rows(out, "attn_decode out", 2)
    cshape, (B, H, hd) = k_cache.shape, q.shape
    if (len(cshape) != 4 or v_cache.shape != cshape or v_type != kv_type
            or cshape[3] != kv_row_bytes(kv_type, hd) // _elem_bytes(kv_type) or out.shape != (B, H * hd)
            or block_table.dim() != 2 or block_table.shape[0] != B or n_ctx.shape != (B,)):
        raise ValueError(f"attn_decode: q {tuple(q.shape)}, out {tuple(out.shape)}, block_table "
                         f"{tuple(block_table.shape)}, n_ctx {tuple(n_ctx.shape)} do not fit caches {tuple(cshape)} "
                         f"and {tuple(v_cache.shape)}")
    N, Hkv, P, _ = cshape
    M = block_table.shape[1]
    if sinks is not None and tuple(sinks.shape) != (H,):
        raise ValueError(f"attn_decode: sinks {tuple(sinks.shape)} must hold one logit per head ({H})")
    sp = ffi.NULL if sinks is None else _flat(sinks, "attn_decode sinks", _F32, "float *")
    status = lib.strata_attn_decode_pooled(ffi.NULL if pool is None else pool.ptr, kv_type, qp, qs, B, H, Hkv, hd,
                                           kcp, vcp, N, P, _flat(block_table, "attn_decode block_table", _I64, "int64_t *"),
                                           M, _flat(n_ctx, "attn_decode n_ctx", _I64, "int64_t *"), scale, sp, int(window),
                                           int(chunk), op, os_, IMPLS[impl] if impl in IMPLS else impl_code(impl))
    if status:
        check(status, f"decode attention of q {tuple(q.shape)} over caches {tuple(cshape)} "
                      f"(H must be a multiple of Hkv; n_ctx in [1, {M * P}]; blocks in [0, {N}); window {window} and chunk {chunk} >= 0, not both)")
    return out


def matvec(x: Any, w: Any, out: Any, impl: str = "auto", pool: Any = None) -> Any:
    """out[T, N] = x[T, n] @ w[N, n]^T in float32 (the router's logits from an F32 router
    weight); x's token stride is free, w and out contiguous. Equal to F.linear within float
    rounding (another summation order). `pool` (a ComputePool): the rows spread over its threads
    when the product is large enough (the same bytes). Returns out."""
    if _F32 is None:
        _init()
    xp, xs = _rows(x, "matvec x", 2)
    T, n = x.shape
    wshape = w.shape
    if len(wshape) != 2 or wshape[1] != n or out.shape != (T, wshape[0]):
        raise ValueError(f"matvec: x {tuple(x.shape)}, w {tuple(wshape)}, out {tuple(out.shape)} "
                         f"(expected w [N, {n}] and out [{T}, N])")
    status = lib.strata_matvec_pooled(ffi.NULL if pool is None else pool.ptr, xp, xs, T, n,
                                      _flat(w, "matvec w", _F32, "float *"), wshape[0],
                                    _flat(out, "matvec out", _F32, "float *"),
                                    IMPLS[impl] if impl in IMPLS else impl_code(impl))
    if status:
        check(status, f"matvec of x {tuple(x.shape)} by w {tuple(wshape)}")
    return out


_GATING = {"softmax": lib.STRATA_GATING_SOFTMAX, "sigmoid": lib.STRATA_GATING_SIGMOID,
           "softmax_weight": lib.STRATA_GATING_SOFTMAX_WEIGHT}


def route(logits: Any, k: int, gating: str, norm: bool, scale: float, expert_ids: Any, weights: Any,
          selection_bias: Any = None, n_groups: int = 0, n_groups_used: int = 0, group_top: int = 0) -> None:
    """Router on logits [T, E] float32: probabilities (softmax, or sigmoid), the k largest per
    token descending (equal values: lower expert id first; torch.topk leaves their order
    unspecified) into expert_ids int64 [T, k] and weights float32 [T, k], renormalised to sum 1
    when norm, times scale: Router.forward after its logits. "softmax_weight" ranks the logits
    and weighs the k chosen by a softmax over theirs (gpt-oss). DeepSeek: experts ranked by
    probability + selection_bias float32 [E], and with n_groups > 1 only those of the
    n_groups_used best groups (a group's score: the sum of its group_top best ranks) compete."""
    if _F32 is None:
        _init()
    g = _GATING.get(gating)
    if g is None:
        raise ValueError(f"expert gating function {gating!r} is not supported (expected softmax, sigmoid or softmax_weight)")
    lp = _flat(logits, "route logits", _F32, "float *")
    T, E = logits.shape
    if expert_ids.shape != (T, k) or weights.shape != (T, k):
        raise ValueError(f"route: expert_ids {tuple(expert_ids.shape)} and weights {tuple(weights.shape)} "
                         f"must be [{T}, {k}]")
    if selection_bias is not None and tuple(selection_bias.shape) != (E,):
        raise ValueError(f"route: selection bias {tuple(selection_bias.shape)} for {E} experts")
    bp = ffi.NULL if selection_bias is None else _flat(selection_bias, "route selection bias", _F32, "float *")
    status = lib.strata_glue_route_groups(lp, T, E, k, g, 1 if norm else 0, scale, bp, n_groups, n_groups_used,
                                          group_top, _flat(expert_ids, "route expert_ids", _I64, "int64_t *"),
                                          _flat(weights, "route weights", _F32, "float *"))
    if status:
        check(status, f"route of logits {tuple(logits.shape)}, top-{k} (k <= E <= 4096, finite logits"
                      f"{f'; {n_groups} groups of which {n_groups_used} kept' if n_groups > 1 else ''})")


def group_assignments(expert_ids: Any, weights: Any, n_experts: int, used: Any, offsets: Any, token_ids: Any,
                      weights_sorted: Any, owned: Any = None) -> int:
    """Sort the T*K assignments of expert_ids int64 [T, K] (weights float32 [T, K]) by expert,
    stably: returns n, the number of experts used; used int32 [E] gets them ascending in [0, n),
    offsets int64 [E+1] their bounds in [0, n] (used[j] owns entries offsets[j]..offsets[j+1]-1),
    token_ids int32 and weights_sorted float32 [T*K] each entry's token and weight. The same
    values as numpy's stable argsort / unique / order // K in RoutedExperts._packed_tokens.
    owned (uint8 [E], or None: all): only the assignments to experts with owned[e] != 0 are
    grouped (an expert-parallel rank's), as they would be among all."""
    if _F32 is None:
        _init()
    ip = _flat(expert_ids, "group expert_ids", _I64, "int64_t *")
    T, K = expert_ids.shape
    if (weights.shape != (T, K) or used.shape != (n_experts,) or offsets.shape != (n_experts + 1,)
            or token_ids.shape != (T * K,) or weights_sorted.shape != (T * K,)):
        raise ValueError(f"group_assignments: expert_ids {tuple(expert_ids.shape)}, weights {tuple(weights.shape)}, "
                         f"used {tuple(used.shape)}, offsets {tuple(offsets.shape)}, token_ids "
                         f"{tuple(token_ids.shape)}, weights_sorted {tuple(weights_sorted.shape)} (E = {n_experts})")
    cell = getattr(_cell, "n", None)
    if cell is None:
        cell = _cell.n = ffi.new("int64_t *")
    if owned is not None and tuple(owned.shape) != (n_experts,):
        raise ValueError(f"group_assignments: owned {tuple(owned.shape)}: expected [{n_experts}]")
    mask = ffi.NULL if owned is None else _flat(owned, "group owned", _U8, "uint8_t *")
    status = lib.strata_glue_group_owned(ip, _flat(weights, "group weights", _F32, "float *"), T, K, n_experts, mask,
                                         _flat(used, "group used", _I32, "int32_t *"),
                                         _flat(offsets, "group offsets", _I64, "int64_t *"),
                                         _flat(token_ids, "group token_ids", _I32, "int32_t *"),
                                         _flat(weights_sorted, "group weights_sorted", _F32, "float *"), cell)
    if status:
        check(status, f"group_assignments of expert ids {tuple(expert_ids.shape)} (ids must lie in [0, {n_experts}))")
    return int(cell[0])


__all__ = ["attn_decode", "group_assignments", "kv_write", "matvec", "rmsnorm", "rope", "route"]
