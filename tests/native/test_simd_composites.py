"""The composite native calls of every vector family against their scalar path: the pooled
matmul, the fused MoE call (SwiGLU and gpt-oss's clamped SwiGLU, whole and as rows + reduce), the
per-head products, decode attention (plain, sinks and window, latent) and the decode program on
tiny models. test_qdot*.py compare the bare tile kernels; these pin that each composite call, for
impl='avx2' and impl='avx512', runs its family's tiles and glue and nothing else differs.

Tolerances, per element (a wrong index, sign or tail gives errors of order one):
- matmul, per-head products: the activation quantizers are bit-exact across families and the
  integer block sums exact, so only the order of the per-block float terms differs:
  |y - y_scalar| <= 2 (n + 16) 2^-24 (|x| @ |W|'), n the blocks (values, for float formats) of a
  row and |W|' test_qdot's magnitude (the min terms of Q4_1, K-quants apart).
- fused MoE: gate and up as above; their error carried through the expert function (measured at
  the corners of the error box) and down's own term; plus, where down rounds its input to 8 bits,
  up to two values of each assignment rounded to the neighbouring step (a value that lands near a
  rounding boundary goes either way), each costing d = max|h| / 127 of its block times |W_down|.
- attention: the softmax weights within 1e-5 relative (summation order, AVX2's polynomial exp):
  |o - o_scalar| <= 2e-5 (|o| + max|v|) per element.
- decode program: several layers of the above compound, and a value rounded to the other 8-bit
  step moves what follows; per step, every logit within 1e-2 of its row's logit range, all but
  two sequence steps within 1e-4 (measured on AVX2: under 2e-7), and the same top token.
Families the CPU lacks skip with the reason; the thread counts change no bytes within a family.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from strata import native
from strata.quant import IQ_TYPES, GGMLType, block_size, random_blocks, row_bytes
from tests.native import test_matmul as tm
from tests.native.test_matmul import pools  # noqa: F401  (the fixture)
from tests.native.test_qdot import ALL_TYPES, FLOAT_TYPES, U, act_block, magnitude

T = GGMLType
FAMILIES = [
    pytest.param("avx2", marks=pytest.mark.skipif(not native.cpu_has_avx2(), reason="CPU has no AVX2/FMA/F16C")),
    pytest.param("avx512", marks=pytest.mark.skipif(
        not native.cpu_has_avx512(), reason="CPU (or OS) without AVX-512 F/BW/VL/VNNI: the AVX-512 family cannot "
                                            "run here")),
]
PACKED = ALL_TYPES + tuple(IQ_TYPES)
# Element magnitudes ~0.03 from random codes (qdot_cases.SCALES), 0.05 for the older formats.
SCALES = {T.IQ1_S: 0.01, T.IQ1_M: 0.01, T.IQ2_XXS: 0.0015, T.IQ2_XS: 0.0015, T.IQ2_S: 0.0015,
          T.IQ3_XXS: 0.0005, T.IQ3_S: 0.0005, T.IQ4_NL: 0.001, T.IQ4_XS: 0.0001, T.TQ1_0: 0.05,
          T.TQ2_0: 0.05, T.NVFP4: 0.005}


def weights(t: GGMLType, n_rows: int, row_len: int, seed: int) -> np.ndarray:
    n_blocks = n_rows * row_len // block_size(t)[0]
    return random_blocks(t, n_blocks, np.random.default_rng(seed), SCALES.get(t, 0.05)).reshape(-1)


def row_len_of(t: GGMLType, n_blocks: int) -> int:
    return 37 * n_blocks if t in FLOAT_TYPES else n_blocks * block_size(t)[0]


def sum_terms(t: GGMLType, row_len: int) -> int:
    """Float terms summed per output (test_qdot's n): blocks, or values of a float format, + 16."""
    return (row_len if t in FLOAT_TYPES else row_len // block_size(t)[0]) + 16


def product_bound(t: GGMLType, w: np.ndarray, n_rows: int, row_len: int, x: np.ndarray) -> np.ndarray:
    """[T, N]: how far a family's y = x @ W^T may be from the scalar one (module docstring)."""
    mag = magnitude(t, w.reshape(n_rows, -1), n_rows, row_len)
    return 2 * sum_terms(t, row_len) * U * (np.abs(x.astype(np.float64)) @ mag.T) + 1e-37


def assert_within(got: np.ndarray, ref: np.ndarray, bound: np.ndarray, what: str) -> None:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert np.isfinite(ref).all() and np.isfinite(got).all(), what
    err = np.abs(got - ref)
    bad = ~(err <= bound)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} outputs off, worst "
                           f"{float((err / np.maximum(bound, 1e-300)).max()):.3g} x the bound")


# ---- the pooled matmul ----

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("t", PACKED, ids=lambda t: t.name)
def test_matmul_of_each_family_matches_scalar(pools, t, family):  # noqa: F811
    """Decode (1 token) and prefill (3, 64) counts; rows enough to split over 3 threads, and a
    count not a multiple of the row blocks; 1-3 threads give the same bytes."""
    row_len = row_len_of(t, 3)
    for n_tokens in (1, 3, 64):
        for n_rows in (17, -(-tm.SPLIT_WORK // (row_bytes(t, row_len) * n_tokens)) | 1):
            w = weights(t, n_rows, row_len, seed=int(t) * 31 + n_rows)
            x = tm.activations(n_tokens, row_len, seed=n_tokens)
            x[0, :row_len // 3] = 0                              # zero activation blocks
            ref = tm.matmul(None, t, w, n_rows, x, impl="scalar")
            got = tm.matmul(pools[1], t, w, n_rows, x, impl=family)
            for n in (2, 3):
                again = tm.matmul(pools[n], t, w, n_rows, x, impl=family)
                assert again.tobytes() == got.tobytes(), (n_rows, n_tokens, n)
            assert_within(got, ref, product_bound(t, w, n_rows, row_len, x), f"{t.name} {family} {n_rows}x{n_tokens}")


@pytest.mark.skipif(not native.cpu_has_avx512(), reason="CPU (or OS) without AVX-512 F/BW/VL/VNNI")
@pytest.mark.parametrize("t", PACKED, ids=lambda t: t.name)
def test_avx512_calls_give_the_bytes_of_the_family_the_table_names(t):
    """Every packed type, decode and prefill: an AVX-512 call gives the bytes of the family the
    kernel table names for the phase: its own tiles, or the AVX2 source built for AVX-512 machines
    (VNNI in place of madd + add: the same integers, so the AVX2 build's very bytes)."""
    from strata.native.qdot import kernel_family
    row_len = row_len_of(t, 9)
    w = weights(t, 19, row_len, seed=int(t))
    for n_tokens in (1, 3, 4, 11):
        family = kernel_family(t, "avx512", decode=n_tokens < 4)
        x = tm.activations(n_tokens, row_len, seed=n_tokens)
        got = native.qdot_rows(t, w, 19, row_len, x, impl="avx512")
        assert got.tobytes() == native.qdot_rows(t, w, 19, row_len, x, impl=family).tobytes(), (t.name, n_tokens, family)


# ---- the per-head products ----

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("t,n_rows,row_len", [(T.Q8_0, 48, 64), (T.Q4_K, 20, 256), (T.Q6_K, 16, 512),
                                              (T.F16, 33, 40), (T.BF16, 24, 64), (T.IQ4_NL, 16, 128)])
def test_matmul_heads_of_each_family_matches_scalar(pools, t, n_rows, row_len, family):  # noqa: F811
    """Latent attention's k_b / v_b products: strided x and y inside wider rows, 1 and 5 tokens."""
    H = 5
    w = weights(t, H * n_rows, row_len, seed=n_rows)
    per_head = w.size // H
    for n_tokens in (1, 5):
        wide = torch.from_numpy(tm.activations(n_tokens, H * (row_len + 7), seed=n_tokens)).view(n_tokens, H, -1)
        x = wide[:, :, 3:3 + row_len]
        scratch = torch.empty(native.matmul_heads_scratch_bytes(t, H, n_tokens, row_len), dtype=torch.uint8)
        outs = {}
        for impl, n in (("scalar", 1), (family, 1), (family, 3)):
            y = torch.full((n_tokens, H, n_rows + 2), float("nan"))
            native.matmul_heads(pools[n], t, w, H, n_rows, row_len, x, y[:, :, 1:1 + n_rows], scratch, impl=impl)
            assert torch.isnan(y[:, :, 0]).all() and torch.isnan(y[:, :, -1]).all()
            outs[impl, n] = y[:, :, 1:1 + n_rows].numpy().copy()
        assert outs[family, 1].tobytes() == outs[family, 3].tobytes()
        for h in range(H):
            xh = np.ascontiguousarray(x[:, h].numpy())
            bound = product_bound(t, w[h * per_head:(h + 1) * per_head], n_rows, row_len, xh)
            assert_within(outs[family, 1][:, h], outs["scalar", 1][:, h], bound, f"{t.name} {family} head {h}")


# ---- the fused MoE call ----

# gate, up, down, n_embd D, n_ff F: every type with AVX-512 tiles, i-quants and ternary formats,
# a different type in each part.
MOE_SHAPES = [
    (T.Q4_0, T.Q8_0, T.Q4_K, 256, 256),
    (T.Q4_K, T.Q5_K, T.Q6_K, 256, 256),
    (T.MXFP4, T.IQ4_NL, T.BF16, 64, 96),
    (T.F16, T.IQ4_XS, T.Q8_0, 256, 64),
    (T.IQ2_XXS, T.IQ3_S, T.IQ2_S, 256, 256),
    (T.IQ1_M, T.TQ2_0, T.NVFP4, 256, 128),
    (T.Q2_K, T.TQ1_0, T.IQ3_XXS, 256, 256),
]
MOE_IDS = ["-".join(t.name for t in s[:3]) for s in MOE_SHAPES]


def silu_glu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return g / (1 + np.exp(-g)) * u


def clamped_glu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    g, u = np.minimum(g, tm.LIMIT), np.clip(u, -tm.LIMIT, tm.LIMIT)
    with np.errstate(over="ignore"):
        return (u + 1) * g / (1 + np.exp(-tm.ALPHA * g))


def assignment_bounds(parts: native.MoeParts, x: np.ndarray, route, glu, biases=None) -> np.ndarray:
    """[A, D]: how far a family's unweighted down vector of each assignment may be from the
    scalar one (module docstring), from float64 products on the dequantized experts."""
    expert_index, offsets, token_ids, _ = route
    down_t, F = parts.down.type, parts.n_ff
    rel_g, rel_u = (2 * sum_terms(p.type, p.row_len) * U for p in (parts.gate, parts.up))
    rel_d = 2 * sum_terms(down_t, F) * U
    act = act_block(down_t)
    out = np.zeros((offsets[-1] - offsets[0], parts.n_embd))
    for j, e in enumerate(expert_index):
        lo, hi = offsets[j], offsets[j + 1]
        if lo == hi:
            continue
        deq = [native.dequantize(p.type, p.matrix(e), (p.n_rows, p.row_len)).astype(np.float64) for p in parts]
        mags = [magnitude(p.type, np.asarray(p.matrix(e)).reshape(p.n_rows, -1), p.n_rows, p.row_len) for p in parts]
        xe = np.abs(x[token_ids[lo:hi]].astype(np.float64))                       # [n, D]
        g, u = x[token_ids[lo:hi]].astype(np.float64) @ deq[0].T, x[token_ids[lo:hi]].astype(np.float64) @ deq[1].T
        if biases is not None:
            g, u = g + biases[0][j], u + biases[1][j]
        eg, eu = 2 * rel_g * (xe @ mags[0].T), 2 * rel_u * (xe @ mags[1].T)      # x2: activation rounding
        h = glu(g, u)                                                             # [n, F]
        eh = np.max([np.abs(glu(g + sg * eg, u + su * eu) - h) for sg in (-1, 1) for su in (-1, 1)], axis=0)
        eh = 2 * eh + 1e-6 * np.abs(h)                                            # the vector exp
        bound = eh @ mags[2].T + 2 * rel_d * (np.abs(h) @ mags[2].T)
        if act > 1:                                                               # two values a step off
            d = np.repeat(np.abs(h).reshape(len(h), -1, act).max(axis=2) * 1.05 / 127, act, axis=1)  # [n, F]
            bound += 2 * (d[:, None, :] * mags[2][None]).max(axis=2)
        out[lo - offsets[0]:hi - offsets[0]] = bound
    return out


def token_bounds(rows_bound: np.ndarray, route, n_tokens: int, out0: np.ndarray) -> np.ndarray:
    _, offsets, token_ids, weights_ = route
    bound = 1e-6 * np.abs(out0.astype(np.float64)) + 1e-30
    for a in range(offsets[0], offsets[-1]):
        bound[token_ids[a]] += abs(weights_[a]) * rows_bound[a - offsets[0]] * 1.001
    return bound


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", MOE_SHAPES, ids=MOE_IDS)
def test_moe_of_each_family_matches_scalar(pools, shape, family):  # noqa: F811
    """Decode (1 token, top 8 and top 1) and prefill (7 tokens top 4, 64 tokens top 2) routings,
    on 1 and 3 threads; the family's call equals its own per-expert matmuls bit for bit."""
    parts = tm.moe_parts(*shape, seed=int(shape[0]))
    D = shape[3]
    for n_tokens, top_k in ((1, 8), (1, 1), (7, 4), (64, 2)):
        route = tm.routing(n_tokens, top_k, seed=n_tokens + top_k)
        x = tm.activations(n_tokens, D, seed=top_k)
        out0 = tm.activations(n_tokens, D, seed=5)
        ref = tm.run_moe(pools[1], parts, x, out0.copy(), route, impl="scalar")
        got = tm.run_moe(pools[1], parts, x, out0.copy(), route, impl=family)
        assert tm.run_moe(pools[3], parts, x, out0.copy(), route, impl=family).tobytes() == got.tobytes()
        if n_tokens < 64:
            assert got.tobytes() == tm.moe_from_matmul(parts, x, out0, *route, impl=family).tobytes()
        bound = token_bounds(assignment_bounds(parts, x, route, silu_glu), route, n_tokens, out0)
        assert_within(got, ref, bound, f"{family} T={n_tokens} k={top_k}")


def _call_rows(pool, parts, x, route, impl, act=None, ids=None):
    """MoeCall.rows over the routing's experts in two calls, then reduce: (rows [A, D], out)."""
    expert_index, offsets, token_ids, weights_ = route
    n_tokens = len(x)
    out = np.zeros_like(x)
    call = native.MoeCall(x, out, offsets, token_ids, weights_, len(expert_index), act=act, ids=ids)
    scratch = torch.empty(native.moe_scratch_bytes(parts, n_tokens, len(token_ids)), dtype=torch.uint8)
    half = len(expert_index) // 2
    call.rows(pool, parts, expert_index[:half].tolist(), 0, n_tokens, scratch, impl=impl)
    call.rows(pool, parts, expert_index[half:].tolist(), half, n_tokens, scratch, impl=impl)
    call.reduce(0, len(expert_index), n_tokens)
    return call._rows.copy(), out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", [MOE_SHAPES[1], MOE_SHAPES[2], MOE_SHAPES[4]], ids=lambda s: "-".join(
    t.name for t in s[:3]))
def test_moe_rows_and_reduce_of_each_family_match_scalar(pools, shape, family):  # noqa: F811
    """The rows + reduce split (the hybrid path): each assignment's row within its own bound."""
    parts = tm.moe_parts(*shape, seed=3)
    for n_tokens, top_k in ((1, 8), (9, 3)):
        route = tm.routing(n_tokens, top_k, seed=n_tokens * 3 + top_k)
        x = tm.activations(n_tokens, shape[3], seed=top_k + 1)
        ref_rows, ref = _call_rows(pools[2], parts, x, route, "scalar")
        rows, got = _call_rows(pools[2], parts, x, route, family)
        rb = assignment_bounds(parts, x, route, silu_glu)
        assert_within(rows, ref_rows, rb, f"{family} rows T={n_tokens}")
        assert_within(got, ref, token_bounds(rb, route, n_tokens, np.zeros_like(x)), f"{family} reduce T={n_tokens}")
        assert got.tobytes() == tm.run_moe(pools[2], parts, x, np.zeros_like(x), route, impl=family).tobytes()


@pytest.mark.parametrize("family", FAMILIES)
def test_moe_clamped_swiglu_of_each_family_matches_scalar(pools, family):  # noqa: F811
    """gpt-oss's expert function with biases (strata_moe_glu), MXFP4 gate and up, whole and as rows."""
    parts = tm.moe_parts(T.MXFP4, T.MXFP4, T.Q8_0, 64, 96, seed=6)
    rng = np.random.default_rng(8)
    b_gate, b_up = rng.standard_normal((2, tm.N_HELD, 96)).astype(np.float32)
    b_down = rng.standard_normal((tm.N_HELD, 64)).astype(np.float32)
    act = native.MoeAct(b_gate, b_up, b_down, tm.ALPHA, tm.LIMIT)
    for n_tokens, top_k in ((1, 4), (12, 2)):
        route = tm.routing(n_tokens, top_k, seed=n_tokens + 40)
        x = tm.activations(n_tokens, 64, seed=n_tokens) * np.float32(3)   # some gates past the limit
        ids = route[0].copy()
        scratch = np.empty(native.moe_scratch_bytes(parts, n_tokens, len(route[2])), np.uint8)
        ref, got = (native.moe_swiglu(pools[2], x, np.zeros_like(x), parts, *route, scratch, impl=impl, act=act,
                                      ids=ids) for impl in ("scalar", family))
        rb = assignment_bounds(parts, x, route, clamped_glu, biases=(b_gate[ids], b_up[ids]))
        assert_within(got, ref, token_bounds(rb, route, n_tokens, np.zeros_like(x)), f"{family} T={n_tokens}")
        ref_rows, _ = _call_rows(pools[2], parts, x, route, "scalar", act, ids)
        rows, _ = _call_rows(pools[2], parts, x, route, family, act, ids)
        assert_within(rows, ref_rows, rb, f"{family} rows T={n_tokens}")


# ---- decode attention ----

def _paged_caches(n_blocks: int, n_head_kv: int, block_size: int, head_dim: int, seed: int, latent: bool = False):
    """k, v caches [N, Hkv, P, hd] (one shared tensor for latent attention: its rows are both)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n_blocks, n_head_kv, block_size, head_dim, generator=g)
    return (k, k) if latent else (k, torch.randn(n_blocks, n_head_kv, block_size, head_dim, generator=g) * 3)


def _attention_of(family: str, q, k, v, table, n_ctx, scale: float, **kw):
    outs = []
    for impl in ("scalar", family):
        out = torch.full((q.shape[0], q.shape[1] * q.shape[2]), float("nan"))
        native.attn_decode(q, k, v, table, n_ctx, scale, out, impl=impl, **kw)
        outs.append(out.double().numpy())
    ref, got = outs
    bound = 2e-5 * (np.abs(ref) + float(v.abs().max()))
    return got, ref, bound


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("H,Hkv,hd,latent", [(16, 4, 64, False), (8, 8, 32, False), (6, 2, 20, False),
                                             (16, 1, 72, True)], ids=["gqa", "mha", "odd-hd", "latent"])
def test_attn_decode_of_each_family_matches_scalar(family, H, Hkv, hd, latent):
    """Plain attention (grouped, full and an odd head size) and latent attention (one cache of rows
    serving as keys and values, one kv head, query heads of the latent width) over shuffled block
    tables of 16 positions, contexts of 1, 17, 300 (past one 256-position pass) and 700."""
    P, n_ctx = 16, torch.tensor([1, 17, 300, 700])
    per_seq = -(-int(n_ctx.max()) // P)
    k, v = _paged_caches(len(n_ctx) * per_seq, Hkv, P, hd, seed=hd, latent=latent)
    table = torch.randperm(len(n_ctx) * per_seq, generator=torch.Generator().manual_seed(1)).view(len(n_ctx), -1)
    q = torch.randn(len(n_ctx), H, hd, generator=torch.Generator().manual_seed(2)) * 2
    got, ref, bound = _attention_of(family, q, k, v, table.contiguous(), n_ctx, 1 / math.sqrt(hd))
    assert_within(got, ref, bound, f"{family} H={H} Hkv={Hkv} hd={hd}")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("window", [0, 5, 128])
def test_attn_decode_sinks_and_window_of_each_family_match_scalar(family, window):
    """gpt-oss's attention: a sink logit per head (above, below and among the scores) and a
    sliding window shorter and longer than the contexts."""
    H, Hkv, hd, P, n_ctx = 8, 2, 32, 16, torch.tensor([1, 5, 41, 300, 512])
    per_seq = 32
    k, v = _paged_caches(len(n_ctx) * per_seq, Hkv, P, hd, seed=window)
    table = torch.randperm(len(n_ctx) * per_seq, generator=torch.Generator().manual_seed(3)).view(len(n_ctx), -1)
    q = torch.randn(len(n_ctx), H, hd, generator=torch.Generator().manual_seed(4)) * 2
    for sinks in (None, torch.tensor([-30.0, -3.0, 0.0, 0.5, 2.0, 5.0, 12.0, 40.0])):
        got, ref, bound = _attention_of(family, q, k, v, table.contiguous(), n_ctx, hd ** -0.5, sinks=sinks,
                                        window=window)
        assert_within(got, ref, bound, f"{family} window {window} sinks {sinks is not None}")


# ---- the decode program on tiny models ----

def _program_logits(model, prompts: list[list[int]], feed: list[list[int]], impl: str,
                    monkeypatch) -> list[np.ndarray]:
    """Prefill each prompt (auto family), then decode the tokens of `feed` (one list per step, one
    token per sequence) through the model's decode program run with `impl`: each step's logits."""
    calls = []
    run = native.DecodeLayers.run

    def run_with(self, *args, **kw):
        calls.append(impl)
        return run(self, *args, **{**kw, "impl": impl})

    monkeypatch.setattr(native.DecodeLayers, "run", run_with)
    t = model.runner  # decode steps through the plan's runner: the program
    slots = [model.cache.allocate() for _ in prompts]
    try:
        for slot, ids in zip(slots, prompts):
            t(torch.tensor(ids), model.cache.batch([slot], [0], [len(ids)]), model.cache)
        starts, out = [len(p) for p in prompts], []
        for step in feed:
            out.append(t(torch.tensor(step), model.cache.batch(slots, starts, [1] * len(slots)), model.cache)
                       .double().numpy().copy())
            starts = [s + 1 for s in starts]
    finally:
        for s in slots:
            model.cache.free(s)
        monkeypatch.setattr(native.DecodeLayers, "run", run)
    assert len(calls) >= len(feed), "the decode program did not run"
    return out


# Decode program bounds, of each logit's row range: the tight one holds where every 8-bit rounding
# went the same way (measured: under 2e-7); a value rounded to the neighbouring step (which family
# ran the prefill decides which values sit near a boundary) moves its row by about a step's share
# of one product (measured: 1.2e-3 on deepseek3, the prefill on AVX-512), so a few sequence steps
# may pass the tight bound, none the flip bound; a wrong index or sign moves rows by order one.
TIGHT_BOUND, FLIP_BOUND = 1e-4, 1e-2


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("key", ["qwen3moe", "gptoss", "deepseek3"])
def test_decode_program_of_each_family_matches_scalar(family, key, monkeypatch):
    """Every layer's attention half (plain; sinks and windows; latent), router and experts in one
    native call, default-typed files (Q8_0 attention, K-quant experts): three sequences at
    different positions, 6 steps fed the same tokens in both runs."""
    import strata
    from strata.runtime.plan import PROGRAM
    from tests.fixtures.tiny import zoo
    tiny = zoo().get(key)
    prompts = [tiny.prompt_ids(5, seed=2), tiny.prompt_ids(19, seed=3), tiny.prompt_ids(11, seed=4)]
    feed = [list(s) for s in zip(*(tiny.prompt_ids(6, seed=9 + i) for i in range(3)))]
    with strata.load(tiny.gguf(None), threads=2, n_ctx=128, max_batch=3, compute="packed", memory="direct") as m:
        assert m.runner.program is not None and m.plan.decode == PROGRAM, (key, m.plan)
        ref = _program_logits(m, prompts, feed, "scalar", monkeypatch)
        got = _program_logits(m, prompts, feed, family, monkeypatch)
    flipped = 0
    for i, (a, b) in enumerate(zip(got, ref)):
        span = b.max(-1, keepdims=True) - b.min(-1, keepdims=True)                 # [B, 1]
        assert_within(a, b, FLIP_BOUND * span * np.ones_like(b), f"{key} {family} step {i}")
        flipped += int((np.abs(a - b) > TIGHT_BOUND * span).any(-1).sum())
        assert (a.argmax(-1) == b.argmax(-1)).all(), f"{key} {family} step {i}: top token"
    assert flipped <= 2, f"{key} {family}: {flipped} of {len(got) * len(prompts)} sequence steps past the tight bound"
