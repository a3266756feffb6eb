"""Decoder glue (native/glue.c, strata/native/glue.py) against the torch and numpy formulations
it replaces: strata.models' RMSNorm, Rope.apply, Attention.attend_decode and Router, and the numpy
grouping of RoutedExperts._packed_tokens.

Tolerances: RMSNorm within 2e-6 relative (the mean is summed in double, torch sums in float32);
RoPE bit for bit (the same float products and sums); KV writes and grouping bit for bit; decode
attention within 1e-5 relative to the output's scale (a different summation order and, for AVX2,
a polynomial exp within 2 ulp); router weights within 1e-6 and expert ids exactly (random
logits have no ties).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from strata import native
from strata.errors import NativeError
from strata.models.attention import Attention
from strata.models.batch import Batch
from strata.models.layers import RMSNorm
from strata.models.executor import NativeRouter
from strata.models.moe import Router
from strata.models.rope import Rope

IMPLS = ["scalar", pytest.param("avx2", marks=pytest.mark.skipif(
    not native.cpu_has_avx2(), reason="CPU has no AVX2/FMA/F16C"))]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- RMSNorm ----

@pytest.mark.parametrize("T,D", [(1, 1024), (5, 64), (3, 37)])
def test_rmsnorm_matches_layer(T, D):
    g = _gen(T * D)
    x = torch.randn(T, D, generator=g) * 3
    w = torch.randn(D, generator=g)
    want = RMSNorm(w, 1e-6)(x)
    out = torch.empty_like(x)
    native.rmsnorm(x, w, 1e-6, out)
    torch.testing.assert_close(out, want, rtol=2e-6, atol=1e-6 * want.abs().max().item())


def test_rmsnorm_per_head_on_a_column_slice_and_in_place():
    T, H, hd, Hkv = 3, 4, 64, 2
    g = _gen(1)
    qkv = torch.randn(T, (H + 2 * Hkv) * hd, generator=g)
    w = torch.randn(hd, generator=g)
    q = qkv[:, :H * hd].view(T, H, hd)  # a strided view, as the stacked q/k/v product is split
    want = RMSNorm(w, 1e-5)(q)
    out = torch.empty(T, H, hd)
    native.rmsnorm(q, w, 1e-5, out)
    torch.testing.assert_close(out, want, rtol=2e-6, atol=1e-6 * want.abs().max().item())
    rest = qkv[:, H * hd:].clone()
    native.rmsnorm(q, w, 1e-5, q)  # in place
    assert torch.equal(q, out) and torch.equal(qkv[:, H * hd:], rest)


def test_rmsnorm_refuses_bad_arguments():
    x, w = torch.randn(2, 8), torch.randn(8)
    with pytest.raises(ValueError, match="rmsnorm"):
        native.rmsnorm(x, torch.randn(7), 1e-6, torch.empty(2, 8))
    with pytest.raises(ValueError, match="float32"):
        native.rmsnorm(x.double(), w, 1e-6, torch.empty(2, 8))
    with pytest.raises(ValueError, match="packed rows"):
        native.rmsnorm(x.t(), w[:2], 1e-6, torch.empty(8, 2))


# ---- RoPE ----

def _rope(neox: bool, rope_dim: int) -> Rope:
    r = Rope.__new__(Rope)
    r.neox, r.rope_dim = neox, rope_dim
    return r


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("hd,rope_dim", [(64, 64), (64, 32), (128, 64)])
def test_rope_exact(neox, hd, rope_dim):
    T, H, Hkv = 4, 6, 2
    g = _gen(hd + rope_dim + neox)
    qkv = torch.randn(T, (H + 2 * Hkv) * hd, generator=g)
    pos = torch.tensor([0, 7, 100, 4095]).float()
    inv = 1.0 / (10000 ** (torch.arange(0, rope_dim, 2).float() / rope_dim))
    ang = pos[:, None] * inv[None]
    cos, sin = ang.cos() * 1.1, ang.sin() * 1.1  # [T, R/2], a yarn-like scale
    q = qkv[:, :H * hd].view(T, H, hd)
    k = qkv[:, H * hd:(H + Hkv) * hd].view(T, Hkv, hd)
    r = _rope(neox, rope_dim)
    want_q, want_k = r.apply(q.clone(), cos, sin), r.apply(k.clone(), cos, sin)
    v_before = qkv[:, (H + Hkv) * hd:].clone()
    native.rope(q, cos, sin, rope_dim, neox)
    native.rope(k, cos, sin, rope_dim, neox)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert torch.equal(qkv[:, (H + Hkv) * hd:], v_before)


def test_rope_refuses_mismatched_tables():
    with pytest.raises(ValueError, match="rope: cos"):
        native.rope(torch.randn(2, 2, 8), torch.randn(2, 3), torch.randn(2, 3), 8, True)
    with pytest.raises(ValueError, match="rope_dim 3"):
        native.rope(torch.randn(2, 2, 8), torch.randn(2, 1), torch.randn(2, 1), 3, True)
    with pytest.raises(NativeError, match="rope"):  # rope_dim past the head
        native.rope(torch.randn(2, 2, 8), torch.randn(2, 5), torch.randn(2, 5), 10, True)


# ---- KV write and decode attention ----

def _cache(S=3, Hkv=4, C=512, hd=64, seed=0):
    g = _gen(seed)
    return torch.randn(S, Hkv, C, hd, generator=g), torch.randn(S, Hkv, C, hd, generator=g)


def test_kv_write_matches_index_put():
    T, Hkv, hd = 3, 4, 64
    k_cache, v_cache = _cache()
    want_k, want_v = k_cache.clone(), v_cache.clone()
    kv = torch.randn(T, 2 * Hkv * hd + 16)
    k, v = kv[:, :Hkv * hd].view(T, Hkv, hd), kv[:, Hkv * hd:2 * Hkv * hd].view(T, Hkv, hd)
    slots, positions = torch.tensor([2, 0, 2]), torch.tensor([5, 511, 6])
    want_k[slots, :, positions] = k
    want_v[slots, :, positions] = v
    native.kv_write(k, v, k_cache, v_cache, slots, positions)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_kv_write_checks_every_index_before_writing():
    k_cache, v_cache = _cache()
    before = k_cache.clone()
    k = torch.randn(2, 4, 64)
    with pytest.raises(NativeError, match="kv_write"):
        native.kv_write(k, k, k_cache, v_cache, torch.tensor([0, 3]), torch.tensor([1, 2]))
    with pytest.raises(NativeError, match="kv_write"):
        native.kv_write(k, k, k_cache, v_cache, torch.tensor([0, 1]), torch.tensor([1, 512]))
    assert torch.equal(k_cache, before)


def _paged(k_cache, starts, P=16, seed=0):
    """The first sequences of a contiguous cache [S, Hkv, C, hd] copied into a pool of blocks of P
    positions [N, Hkv, P, hd], in shuffled blocks: (pool, block tables)."""
    S, Hkv, C, hd = k_cache.shape
    n_each = C // P
    order = torch.randperm(S * n_each, generator=_gen(seed))
    pool = torch.full((S * n_each, Hkv, P, hd), float("nan"))  # unmapped blocks are never read
    tables = []
    for s in range(len(starts)):
        table = order[s * n_each:(s + 1) * n_each].tolist()
        for i, blk in enumerate(table[:-(-(starts[s] + 1) // P)]):
            pool[blk] = k_cache[s, :, i * P:(i + 1) * P]
        tables.append(table)
    return pool, tables


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("H,Hkv,hd,starts", [(16, 4, 64, (99,)), (8, 8, 32, (0, 300, 17)), (4, 2, 20, (511, 3))])
def test_attn_decode_paged_matches_sdpa_and_the_contiguous_cache(impl, H, Hkv, hd, starts):
    """Through shuffled block tables the kernel gives SDPA's result, and exactly the bytes it gives
    over the same positions in one contiguous region (blocks of 16 keep its order of sums)."""
    B = len(starts)
    k_cache, v_cache = _cache(S=B, Hkv=Hkv, hd=hd, seed=H + hd)
    (k_pool, tables), (v_pool, _) = _paged(k_cache, starts, seed=hd), _paged(v_cache, starts, seed=hd)
    batch = Batch.make(tables, starts, [1] * B, 16)
    qkv = torch.randn(B, (H + 2 * Hkv) * hd, generator=_gen(B))
    q = qkv[:, :H * hd].view(B, H, hd)
    want = Attention.attend_decode(None, q, batch, k_pool, v_pool)  # [B, H*hd]
    out, flat = torch.empty(B, H * hd), torch.empty(B, H * hd)
    n_ctx = batch.positions + 1
    native.attn_decode(q, k_pool, v_pool, batch.block_table, n_ctx, 1 / math.sqrt(hd), out, impl=impl)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    native.attn_decode(q, k_cache, v_cache, torch.arange(B)[:, None], n_ctx, 1 / math.sqrt(hd), flat, impl=impl)
    assert torch.equal(out, flat)


@pytest.mark.parametrize("impl", IMPLS)
def test_attn_decode_long_context_and_scale(impl):
    """Past one 256-position pass the passes are joined by online rescaling; a large scale makes
    later positions dominate, so a wrong rescale shows. Blocks of 7 positions: runs cross the
    passes' boundaries."""
    H, Hkv, hd, n, P = 4, 1, 64, 700, 7
    k_cache, v_cache = _cache(S=1, Hkv=Hkv, C=1024, hd=hd, seed=9)
    k_cache[0, 0, 600:n] *= 3
    q = torch.randn(1, H, hd, generator=_gen(3))
    k, v = k_cache[0, :, :n], v_cache[0, :, :n]  # [Hkv, n, hd]
    p = (torch.einsum("hd,nd->hn", q[0].double(), k[0].double()) * 0.5).softmax(-1)
    want = (p @ v[0].double()).float().reshape(1, H * hd)
    nb = -(-1024 // P)
    table = torch.randperm(nb, generator=_gen(4))
    k_pool, v_pool = torch.zeros(nb, Hkv, P, hd), torch.zeros(nb, Hkv, P, hd)
    pad = torch.zeros(1, Hkv, nb * P - 1024, hd)
    k_pool[table] = torch.cat((k_cache, pad), 2).view(Hkv, nb, P, hd).transpose(0, 1)
    v_pool[table] = torch.cat((v_cache, pad), 2).view(Hkv, nb, P, hd).transpose(0, 1)
    for kc, vc, tab in ((k_cache, v_cache, torch.tensor([[0]])), (k_pool, v_pool, table[None])):
        out = torch.empty(1, H * hd)
        native.attn_decode(q, kc, vc, tab.contiguous(), torch.tensor([n]), 0.5, out, impl=impl)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("window", [0, 1, 5, 16, 128, 300])
def test_attn_decode_sinks_and_window_match_the_torch_path(impl, window):
    """gpt-oss's decode attention: a sliding window and a sink logit per head, through shuffled
    block tables, against the torch path the float compute uses (`attend_sinks`); sinks above
    every score, below every score and in between; contexts past one 256-position pass."""
    from strata.models.attention import attend_sinks
    H, Hkv, hd, starts = 8, 2, 32, (0, 4, 40, 299, 511)
    B = len(starts)
    k_cache, v_cache = _cache(S=B, Hkv=Hkv, hd=hd, seed=window + 1)
    (k_pool, tables), (v_pool, _) = _paged(k_cache, starts, seed=hd), _paged(v_cache, starts, seed=hd)
    batch = Batch.make(tables, starts, [1] * B, 16)
    q = torch.randn(B, H, hd, generator=_gen(window + 2)) * 2
    scale = 1 / math.sqrt(hd)
    for sinks in (None, torch.tensor([-30.0, -3.0, 0.0, 0.5, 2.0, 5.0, 12.0, 40.0])):
        want = attend_sinks(q, batch, k_pool, v_pool, sinks, window, scale)  # [B, H*hd]
        out = torch.full((B, H * hd), float("nan"))
        native.attn_decode(q, k_pool, v_pool, batch.block_table, batch.positions + 1, scale, out, impl=impl,
                           sinks=sinks, window=window)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    with pytest.raises(ValueError, match="one logit per head"):
        native.attn_decode(q, k_pool, v_pool, batch.block_table, batch.positions + 1, scale, out, sinks=torch.zeros(3))
    with pytest.raises(NativeError, match="window"):
        native.attn_decode(q, k_pool, v_pool, batch.block_table, batch.positions + 1, scale, out, window=-1)


@pytest.mark.parametrize("impl", IMPLS)
def test_attn_decode_chunks_match_the_torch_path(impl):
    """Llama 4's local layers: each query within its own chunk of 8 positions (positions at, just
    past and well past chunk boundaries), equal to the torch path the float compute uses
    (`attend_chunked`) and, bit for bit, to each sequence's own call with the window from its
    chunk's start; a window with a chunk is refused."""
    from strata.models.chunked import attend_chunked
    H, Hkv, hd, starts, chunk = 4, 2, 32, (0, 7, 8, 9, 299), 8
    B = len(starts)
    k_cache, v_cache = _cache(S=B, Hkv=Hkv, hd=hd, seed=3)
    (k_pool, tables), (v_pool, _) = _paged(k_cache, starts, seed=hd), _paged(v_cache, starts, seed=hd)
    batch = Batch.make(tables, starts, [1] * B, 16)
    q, n_ctx = torch.randn(B, H, hd, generator=_gen(4)), batch.positions + 1
    out = torch.empty(B, H * hd)
    native.attn_decode(q, k_pool, v_pool, batch.block_table, n_ctx, hd ** -0.5, out, impl=impl, chunk=chunk)
    want = attend_chunked(q, batch, k_pool, v_pool, chunk)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    for b, start in enumerate(starts):
        alone = torch.empty(1, H * hd)
        native.attn_decode(q[b:b + 1], k_pool, v_pool, batch.block_table[b:b + 1], n_ctx[b:b + 1], hd ** -0.5, alone,
                           impl=impl, window=start % chunk + 1)
        assert torch.equal(alone, out[b:b + 1]), start
    with pytest.raises(NativeError, match="not both"):
        native.attn_decode(q, k_pool, v_pool, batch.block_table, n_ctx, hd ** -0.5, out, window=4, chunk=chunk)


def test_attn_decode_refuses_bad_context_and_blocks():
    k_cache, v_cache = _cache(S=2)  # 2 blocks of 512 positions
    q, out = torch.randn(1, 16, 64), torch.empty(1, 16 * 64)
    for table, n_ctx in (([[2]], [5]), ([[-1]], [5]), ([[0]], [0]), ([[0]], [513]), ([[0, 2]], [513]),
                         ([[0, 1, 7]], [1025])):
        with pytest.raises(NativeError, match="decode attention"):
            native.attn_decode(q, k_cache, v_cache, torch.tensor(table), torch.tensor(n_ctx), 0.125, out)
    native.attn_decode(q, k_cache, v_cache, torch.tensor([[1, 0, 7]]), torch.tensor([1024]), 0.125, out)  # 7 unread
    with pytest.raises(NativeError, match="decode attention"):  # 6 heads over 4 kv heads
        native.attn_decode(torch.randn(1, 6, 64), k_cache, v_cache, torch.tensor([[0]]), torch.tensor([5]), 0.125,
                           torch.empty(1, 6 * 64))


# ---- router ----

@pytest.mark.parametrize("gating,norm,scale", [("softmax", True, 1.0), ("softmax", False, 1.0),
                                               ("sigmoid", True, 2.5), ("sigmoid", False, 1.0),
                                               ("softmax_weight", False, 1.0), ("softmax_weight", True, 0.5)])
@pytest.mark.parametrize("T,E,K", [(1, 64, 8), (7, 128, 8), (3, 8, 2)])
def test_route_matches_router(gating, norm, scale, T, E, K):
    logits = torch.randn(T, E, generator=_gen(T * E + K)) * 2
    want_w, want_ids = Router(torch.eye(E), K, gating, norm, scale)(logits)  # F.linear with I: the logits exactly
    ids, w = torch.empty(T, K, dtype=torch.int64), torch.empty(T, K)
    native.route(logits, K, gating, norm, scale, ids, w)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(w, want_w, rtol=1e-6, atol=1e-7)


def test_route_ties_go_to_the_lower_expert():
    """torch.topk leaves the order of equal values unspecified; the native router fixes it."""
    logits = torch.tensor([[0.0, 1.0, 1.0, 0.5, 1.0, 0.5]])
    ids, w = torch.empty(1, 4, dtype=torch.int64), torch.empty(1, 4)
    native.route(logits, 4, "softmax", False, 1.0, ids, w)
    assert ids.tolist() == [[1, 2, 4, 3]]
    assert w[0, 0] == w[0, 1] == w[0, 2] and w[0, 3] < w[0, 2]


def native_router(r: Router) -> NativeRouter:
    """The native executor's router with `r`'s weights and options."""
    return NativeRouter(r.weight, r.k, r.gating, r.norm, r.scale, r.bias, r.selection_bias, r.n_groups,
                        r.n_groups_used, r.group_score)


def test_route_softmax_weight_with_a_biased_router():
    """gpt-oss's router: logits plus a bias, the top k of them, a softmax over those k; the
    native path (NativeRouter: native logits, the bias added, native.route) picks the
    torch path's experts with its weights; logits of -inf are never chosen."""
    T, E, K, D = 9, 32, 4, 48
    weight, bias = torch.randn(E, D, generator=_gen(5)), torch.randn(E, generator=_gen(6)) * 3
    x = torch.randn(T, D, generator=_gen(7))
    r = Router(weight, K, "softmax_weight", False, 1.0, bias=bias)
    assert r.plain
    want_w, want_ids = r(x)
    got_w, got_ids = native_router(r)(x)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, rtol=1e-5, atol=1e-6)
    assert torch.allclose(got_w.sum(-1), torch.ones(T))
    logits = torch.tensor([[float("-inf"), 0.0, float("-inf"), -50.0]])
    ids, w = torch.empty(1, 2, dtype=torch.int64), torch.empty(1, 2)
    native.route(logits, 2, "softmax_weight", False, 1.0, ids, w)
    assert ids.tolist() == [[1, 3]] and w[0, 0] > 0.99
    with pytest.raises(NativeError, match="route"):  # two -inf logits leave one candidate for k = 3
        native.route(logits, 3, "softmax_weight", False, 1.0, torch.empty(1, 3, dtype=torch.int64), torch.empty(1, 3))


@pytest.mark.parametrize("gating,groups,used,score,bias", [
    ("sigmoid", 8, 4, "top2", True),     # DeepSeek-V3: sigmoid, selection bias, 4 of 8 groups by their top 2
    ("sigmoid", 4, 1, "top2", True),
    ("softmax", 4, 1, "max", False),     # DeepSeek-V2: softmax, the best group by its best expert
    ("softmax", 0, 0, "max", True),      # a selection bias without groups
    ("sigmoid", 64, 8, "top2", False),   # groups of one expert: a score of its one rank
])
@pytest.mark.parametrize("norm,scale", [(True, 2.5), (False, 1.0)])
def test_route_groups_and_selection_bias_match_the_router(gating, groups, used, score, bias, norm, scale):
    """DeepSeek's routers: the native path (NativeRouter) chooses the torch path's experts
    with its weights, token by token."""
    T, E, K, D = 33, 64, 6, 40
    weight = torch.randn(E, D, generator=_gen(11)) * 0.5
    sel = torch.randn(E, generator=_gen(12)) * 0.3 if bias else None
    r = Router(weight, K, gating, norm, scale, selection_bias=sel, n_groups=groups, n_groups_used=used,
               group_score=score)
    assert r.plain
    x = torch.randn(T, D, generator=_gen(13))
    want_w, want_ids = r(x)
    got_w, got_ids = native_router(r)(x)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, rtol=1e-5, atol=1e-6)
    if groups > 1:  # the chosen experts lie in at most `used` groups
        assert all(len(set((row // (E // groups)).tolist())) <= used for row in got_ids)


def test_route_groups_refuse_bad_arguments():
    logits, ids, w = torch.randn(2, 16), torch.empty(2, 2, dtype=torch.int64), torch.empty(2, 2)
    for groups, used, top in ((3, 1, 1), (4, 0, 1), (4, 4, 1), (4, 2, 5)):  # 16 % 3; none kept; all kept; top > 4
        with pytest.raises(NativeError, match="groups"):
            native.route(logits, 2, "sigmoid", False, 1.0, ids, w, None, groups, used, top)
    with pytest.raises(ValueError, match="selection bias"):
        native.route(logits, 2, "sigmoid", False, 1.0, ids, w, torch.zeros(15))


def test_route_refuses_bad_arguments():
    ids, w = torch.empty(1, 2, dtype=torch.int64), torch.empty(1, 2)
    with pytest.raises(ValueError, match="gating"):
        native.route(torch.randn(1, 4), 2, "relu", False, 1.0, ids, w)
    with pytest.raises(NativeError, match="route"):  # NaN logits leave one candidate for k = 2
        native.route(torch.tensor([[float("nan"), float("nan"), float("nan"), 1.0]]), 2, "softmax", False, 1.0, ids, w)
    with pytest.raises(ValueError, match="int64"):
        native.route(torch.randn(1, 4), 2, "softmax", False, 1.0, ids.int(), w)


# ---- grouping of assignments ----

def _numpy_grouping(ids: np.ndarray, weights: np.ndarray):
    """RoutedExperts._packed_tokens' grouping, verbatim."""
    K = ids.shape[1]
    order = np.argsort(ids, axis=None, kind="stable")
    experts = ids.reshape(-1)[order]
    used, starts = np.unique(experts, return_index=True)
    offsets = np.append(starts, order.size).astype(np.int64)
    return used, offsets, (order // K).astype(np.int32), weights.reshape(-1)[order]


@pytest.mark.parametrize("T,E,K", [(1, 64, 8), (37, 16, 4), (512, 128, 8), (5, 3, 3)])
def test_group_assignments_bit_identical_to_numpy(T, E, K):
    g = _gen(T + E)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])  # distinct per token, as top-k gives
    if T > 30:
        ids[: T // 2] = ids[0]  # hot experts: many tokens share them
    weights = torch.rand(T, K, generator=g)
    used, offsets = torch.empty(E, dtype=torch.int32), torch.empty(E + 1, dtype=torch.int64)
    token_ids, weights_sorted = torch.empty(T * K, dtype=torch.int32), torch.empty(T * K)
    n = native.group_assignments(ids, weights, E, used, offsets, token_ids, weights_sorted)
    w_used, w_offsets, w_tokens, w_weights = _numpy_grouping(ids.numpy(), weights.numpy())
    assert n == w_used.size
    assert np.array_equal(used[:n].numpy(), w_used) and np.array_equal(offsets[:n + 1].numpy(), w_offsets)
    assert np.array_equal(token_ids.numpy(), w_tokens)
    assert weights_sorted.numpy().tobytes() == w_weights.tobytes()


@pytest.mark.parametrize("T,E,K", [(1, 64, 8), (37, 16, 4), (300, 128, 8)])
def test_group_assignments_of_owned_experts_are_their_groups_among_all(T, E, K):
    """An expert-parallel rank's grouping (owned): the groups, entries and weights the numpy grouping
    gives those experts when every other rank's assignment goes to a bucket past the last expert."""
    g = _gen(T + 3 * E)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    weights = torch.rand(T, K, generator=g)
    owned = (torch.rand(E, generator=g) < 0.5).to(torch.uint8)
    used, offsets = torch.empty(E, dtype=torch.int32), torch.empty(E + 1, dtype=torch.int64)
    token_ids, weights_sorted = torch.empty(T * K, dtype=torch.int32), torch.empty(T * K)
    n = native.group_assignments(ids, weights, E, used, offsets, token_ids, weights_sorted, owned)
    bucketed = torch.where(owned.bool()[ids], ids, E).numpy()
    w_used, w_offsets, w_tokens, w_weights = _numpy_grouping(bucketed, weights.numpy())
    keep = int((w_used < E).sum())
    m = int(w_offsets[keep])  # the owned entries come first, the bucket's last
    assert n == keep and np.array_equal(used[:n].numpy(), w_used[:keep])
    assert np.array_equal(offsets[:n + 1].numpy(), w_offsets[:keep + 1])
    assert np.array_equal(token_ids[:m].numpy(), w_tokens[:m]) and weights_sorted[:m].numpy().tobytes() == w_weights[:m].tobytes()
    with pytest.raises(ValueError, match="owned"):
        native.group_assignments(ids, weights, E, used, offsets, token_ids, weights_sorted, owned[:-1])


def test_group_assignments_refuses_ids_out_of_range():
    used, offsets = torch.empty(4, dtype=torch.int32), torch.empty(5, dtype=torch.int64)
    token_ids, ws = torch.empty(2, dtype=torch.int32), torch.empty(2)
    for bad in (4, -1):
        with pytest.raises(NativeError, match=r"\[0, 4\)"):
            native.group_assignments(torch.tensor([[0, bad]]), torch.rand(1, 2), 4, used, offsets, token_ids, ws)
    with pytest.raises(ValueError, match="offsets"):
        native.group_assignments(torch.tensor([[0, 1]]), torch.rand(1, 2), 4, used, offsets[:4], token_ids, ws)


# ---- float32 products (router logits) ----

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T,n,N", [(1, 1024, 64), (3, 37, 5), (2, 64, 128)])
def test_matvec_matches_linear(impl, T, n, N):
    g = _gen(T * n + N)
    xs = torch.randn(T, n + 3, generator=g)
    x = xs[:, :n]  # a token stride wider than the row
    w = torch.randn(N, n, generator=g)
    want = torch.nn.functional.linear(x, w)
    out = torch.empty(T, N)
    native.matvec(x, w, out, impl=impl)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5 * math.sqrt(n))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T,n,N", [(1, 1024, 64), (3, 1024, 67), (2, 1024, 3), (1, 16, 64)])
def test_matvec_on_a_pool_is_the_serial_calls_bytes(impl, T, n, N):
    """The fused step's router product spreads its rows (whole groups of 4) over the pool when it is
    large (N x n >= 64 K: pooled here but for the last two), the tail rows included: the serial
    call's bytes."""
    g = _gen(N + T)
    x, w = torch.randn(T, n, generator=g), torch.randn(N, n, generator=g)
    serial, pooled = torch.empty(T, N), torch.empty(T, N)
    native.matvec(x, w, serial, impl=impl)
    with native.ComputePool(2) as pool:
        native.matvec(x, w, pooled, impl=impl, pool=pool)
    assert torch.equal(serial, pooled)


def test_matvec_then_route_equals_router():
    x, w = torch.randn(2, 256, generator=_gen(5)), torch.randn(32, 256, generator=_gen(6))
    want_w, want_ids = Router(w, 4, "softmax", True, 1.0)(x)
    logits, ids, rw = torch.empty(2, 32), torch.empty(2, 4, dtype=torch.int64), torch.empty(2, 4)
    native.route(native.matvec(x, w, logits), 4, "softmax", True, 1.0, ids, rw)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(rw, want_w, rtol=1e-5, atol=1e-6)


def test_matvec_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="matvec"):
        native.matvec(torch.randn(1, 8), torch.randn(4, 7), torch.empty(1, 4))
