"""The pooled matrix product and the fused MoE layer (native/pool.c, native/matmul.c).

Truths: `native.qdot_rows` (the single-threaded kernels) for matmul, bit for bit, whatever the
thread count; float64 `dequantize(W) @ x` within the bound activation rounding allows (each x
block rounded to d = max|x| / 127, so |x - d q| <= max|x| / 254 per element); for the fused MoE
call, a numpy reference made of `native.matmul_into` per expert (bit for bit) and float64
dequantized math (within a few activation roundings).
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from strata import native
from strata.errors import NativeError
from strata.native._lib import ffi, lib
from strata.quant import GGMLType, block_size, random_blocks, row_bytes

T = GGMLType
TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4,
         T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
IMPLS = ["scalar", pytest.param("avx2", marks=pytest.mark.skipif(
    not native.cpu_has_avx2(), reason="CPU has no AVX2/FMA/F16C"))]
# Activation block of each weight format (1: float activations, no rounding).
ACT_BLOCK = {t: (1 if t in (T.F32, T.F16, T.BF16) else block_size(t)[0]) for t in TYPES}


@pytest.fixture(scope="module")
def pools():
    made = {n: native.ComputePool(n) for n in (1, 2, 3, 4)}
    made[None] = None
    yield made
    for p in made.values():
        if p is not None:
            p.close()


def weights(t, n_rows, row_len, seed=0, scale=0.01):
    return random_blocks(t, n_rows * row_len // block_size(t)[0], np.random.default_rng(seed), scale)


def activations(n_tokens, row_len, seed=1):
    return np.random.default_rng(seed).standard_normal((n_tokens, row_len), dtype=np.float32)


def matmul(pool, t, w, n_rows, x, impl="auto"):
    n_tokens, row_len = x.shape
    y = np.full((n_tokens, n_rows), np.nan, dtype=np.float32)
    scratch = np.empty(native.matmul_scratch_bytes(t, n_tokens, row_len), dtype=np.uint8)
    return native.matmul_into(pool, t, w, n_rows, row_len, x, y, scratch, impl=impl)


def rounding_bound(t, w_f64, x):
    """Bound on |y - dequantize(W) @ x|: |W| @ (per-block max|x| / 254), plus float32 summation."""
    b = ACT_BLOCK[t]
    xa = np.abs(x.astype(np.float64))
    per_elem = np.repeat(xa.reshape(len(x), -1, b).max(axis=2) / 254, b, axis=1) if b > 1 else 0 * xa
    wa = np.abs(w_f64)
    return per_elem @ wa.T + 2e-5 * (xa @ wa.T) + 1e-30


# ---- matmul ----

# The runtime gives a thread no less than 64 KiB of work (weight bytes x tokens); these shapes
# carry about five times that, in row counts that split unevenly between 2, 3 and 4 threads.
SPLIT_WORK = 5 * 64 * 1024


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_matmul_equals_qdot_for_every_thread_count(pools, t, impl):
    row_len = 2 * max(ACT_BLOCK[t], 32)
    for n_tokens in (1, 2, 7, 64):
        for n_rows in (1, 17, -(-SPLIT_WORK // (row_bytes(t, row_len) * n_tokens)) | 1):
            w = weights(t, n_rows, row_len, seed=n_rows)
            x = activations(n_tokens, row_len, seed=n_tokens)
            want = native.qdot_rows(t, w, n_rows, row_len, x, impl=impl)
            for n in (None, 1, 2, 3, 4):
                got = matmul(pools[n], t, w, n_rows, x, impl=impl)
                assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), (n_rows, n_tokens, n)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_matmul_within_rounding_bound_of_float64(pools, t):
    n_rows, row_len, n_tokens = 37, 2 * max(ACT_BLOCK[t], 32), 7
    w = weights(t, n_rows, row_len, seed=3, scale=0.05)
    x = activations(n_tokens, row_len, seed=4)
    x[1] *= 1e-3                              # rows far apart in scale are rounded separately
    x[2, :row_len // 2] = 0                   # all-zero activation blocks
    w64 = native.dequantize(t, w, (n_rows, row_len)).astype(np.float64)
    want = x.astype(np.float64) @ w64.T
    got = matmul(pools[2], t, w, n_rows, x)
    err = np.abs(got - want)
    bound = rounding_bound(t, w64, x)
    assert np.all(err <= bound), f"worst excess {np.max(err - bound)}"
    assert np.max(err) > 0 or ACT_BLOCK[t] == 1


def test_matmul_accepts_torch_and_pool_reuse(pools):
    t, n_rows, row_len = T.Q4_K, 300, 512
    w = torch.from_numpy(weights(t, n_rows, row_len))
    x = torch.from_numpy(activations(3, row_len))
    y = torch.empty(3, n_rows)
    scratch = torch.empty(native.matmul_scratch_bytes(t, 3, row_len), dtype=torch.uint8)
    want = native.qdot_rows(t, w.numpy(), n_rows, row_len, x.numpy())
    for _ in range(200):                      # many dispatches on one pool
        y.fill_(0)
        native.matmul_into(pools[3], t, w, n_rows, row_len, x, y, scratch)
        assert np.array_equal(y.numpy(), want)


def test_matmul_scratch_bytes():
    assert native.matmul_scratch_bytes(T.F16, 64, 4096) == 0
    assert native.matmul_scratch_bytes(T.Q4_0, 3, 64) == 3 * 2 * 40
    assert native.matmul_scratch_bytes(T.Q6_K, 2, 512) == 2 * 2 * 292
    with pytest.raises(NativeError, match="multiple"):
        native.matmul_scratch_bytes(T.Q4_K, 1, 100)


def test_matmul_refuses_bad_arguments(pools):
    t, n_rows, row_len = T.Q4_0, 8, 64
    w = weights(t, n_rows, row_len)
    x = activations(2, row_len)
    y = np.zeros((2, n_rows), np.float32)
    s = np.zeros(native.matmul_scratch_bytes(t, 2, row_len), np.uint8)
    call = native.matmul_into
    with pytest.raises(NativeError, match="too small"):
        call(pools[2], t, w[:-1], n_rows, row_len, x, y, s)                  # short weights
    with pytest.raises(NativeError, match="too small"):
        call(pools[2], t, w, n_rows, row_len, x, y, s[:-1])                  # short scratch
    with pytest.raises(NativeError):
        call(pools[2], t, w, n_rows, row_len, x, y, None)                    # no scratch
    with pytest.raises(NativeError, match="multiple"):
        call(None, t, w, 9, 56, np.zeros((2, 56), np.float32), np.zeros((2, 9), np.float32), s)
    with pytest.raises(NativeError, match="unsupported"):
        call(None, T.Q8_1, w, 1, 256, np.zeros((1, 256), np.float32), np.zeros((1, 1), np.float32), s)
    with pytest.raises(ValueError):
        call(None, 12345, w, n_rows, row_len, x, y, s)                       # unknown type id
    with pytest.raises(ValueError):
        call(None, t, w, n_rows, row_len, x.astype(np.float64), y, s)        # x dtype
    with pytest.raises(ValueError):
        call(None, t, w, n_rows, row_len, x, y[:, :4], s)                    # out shape
    with pytest.raises(ValueError):
        call(None, t, w, n_rows, row_len, np.zeros((2, 2 * row_len), np.float32)[:, ::2], y, s)
    with pytest.raises(ValueError):
        call(None, t, w, n_rows, row_len, x, y, s, impl="avx9")
    # The C checks themselves, below the wrapper: NULL and short buffers, negative counts.
    yp = ffi.cast("float *", ffi.from_buffer(y))
    xp = ffi.cast("float *", ffi.from_buffer(x))
    wp, sp = ffi.from_buffer(w), ffi.from_buffer(s)
    ok = (ffi.NULL, int(t), wp, w.nbytes, n_rows, row_len, xp, x.nbytes, 2, yp, y.nbytes, sp, s.nbytes, 0)
    assert lib.strata_matmul(*ok) == lib.STRATA_OK
    for i, bad in [(2, ffi.NULL), (6, ffi.NULL), (9, ffi.NULL), (11, ffi.NULL), (4, -1), (8, -1), (3, -5),
                   (7, x.nbytes - 4), (10, y.nbytes - 4), (13, 99), (1, 99), (9, ffi.cast("float *", 2))]:
        args = list(ok)
        args[i] = bad
        assert lib.strata_matmul(*args) != lib.STRATA_OK, (i, bad)
    assert lib.strata_matmul(*ok[:4], 1 << 62, 1 << 62, *ok[6:]) == lib.STRATA_E_SIZE     # overflow


# ---- the pool ----

def test_pool_threads_and_lifecycle():
    with native.ComputePool(3) as pool:
        assert lib.strata_pool_threads(pool.ptr) == 3
    with pytest.raises(ValueError, match="closed"):
        pool.ptr
    pool.close()                              # idempotent
    with pytest.raises(ValueError):
        native.ComputePool(0)
    out = ffi.new("strata_pool **")
    assert lib.strata_pool_create(0, out) == lib.STRATA_E_ARG
    assert lib.strata_pool_create(257, out) == lib.STRATA_E_ARG
    assert lib.strata_pool_threads(ffi.NULL) == 1
    lib.strata_pool_free(ffi.NULL)


def test_idle_pool_burns_no_cpu():
    with native.ComputePool(4) as pool:
        t = T.Q8_0
        w = weights(t, 64, 64)
        matmul(pool, t, w, 64, activations(4, 64))
        time.sleep(0.05)                      # past the spin window
        cpu0, wall0 = time.process_time(), time.perf_counter()
        time.sleep(0.3)
        cpu = time.process_time() - cpu0
        assert cpu < 0.05 * (time.perf_counter() - wall0), f"idle pool used {cpu:.3f} s of CPU"


def test_pool_shared_by_python_threads_serializes(pools):
    t, n_rows, row_len = T.Q4_0, 96, 128
    w = weights(t, n_rows, row_len)
    xs = [activations(5, row_len, seed=i) for i in range(4)]
    wants = [native.qdot_rows(t, w, n_rows, row_len, x) for x in xs]
    failures = []

    def work(i):
        for _ in range(50):
            if not np.array_equal(matmul(pools[2], t, w, n_rows, xs[i]), wants[i]):
                failures.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures


# ---- the fused MoE layer ----

N_HELD = 10                                   # experts in each part's region
MOE_SHAPES = [  # gate, up, down, n_embd D, n_ff F
    (T.Q4_0, T.Q4_0, T.Q4_0, 64, 96),
    (T.Q4_K, T.Q4_K, T.Q6_K, 256, 256),
    (T.Q8_0, T.Q4_K, T.F16, 256, 64),         # gate and up round x differently; float down
    (T.MXFP4, T.MXFP4, T.BF16, 64, 32),
    (T.F32, T.F16, T.Q5_K, 32, 256),
    (T.IQ4_XS, T.IQ4_XS, T.IQ3_S, 256, 256),  # prefill: gate and up share re-laid activations (VNNI)
    (T.IQ2_XS, T.IQ3_XXS, T.IQ2_S, 512, 256),
    (T.Q2_K, T.Q3_K, T.Q2_K, 256, 512),         # and the K-quants' VNNI prefill tiles
]


def moe_parts(gate_t, up_t, down_t, n_embd, n_ff, seed=0, pad=0):
    """MoeParts over N_HELD experts per family, `pad` bytes between expert matrices."""
    parts = []
    for i, (t, rows, cols) in enumerate([(gate_t, n_ff, n_embd), (up_t, n_ff, n_embd), (down_t, n_embd, n_ff)]):
        size = row_bytes(t, cols) * rows
        slab = np.zeros((N_HELD, size + pad), np.uint8)
        for e in range(N_HELD):
            slab[e, :size] = weights(t, rows, cols, seed=seed * 100 + i * 10 + e, scale=0.05)
        parts.append(native.MoePart(slab.reshape(-1), t, rows, cols, stride=size + pad))
    return native.MoeParts(*parts)


def routing(n_tokens, top_k, seed, idle=(3,)):
    """(expert_index, offsets, token_ids, weights) of a random top-k routing, grouped by expert in
    ascending expert order; the experts in `idle` are listed with no assignments."""
    rng = np.random.default_rng(seed)
    chosen = np.stack([rng.choice([e for e in range(N_HELD) if e not in idle], top_k, replace=False)
                       for _ in range(n_tokens)])                                   # [T, k]
    gate = rng.random((n_tokens, top_k), dtype=np.float32)
    experts, offsets, tokens, weights_ = [], [0], [], []
    for e in range(N_HELD):
        t_e, k_e = np.nonzero(chosen == e)
        if len(t_e) == 0 and e not in idle:
            continue
        experts.append(e)
        tokens.extend(t_e)
        weights_.extend(gate[t_e, k_e])
        offsets.append(len(tokens))
    return (np.array(experts, np.int32), np.array(offsets, np.int64), np.array(tokens, np.int32),
            np.array(weights_, np.float32))


def silu_mul(g, u):
    g64 = g.astype(np.float64)
    with np.errstate(over="ignore"):          # exp(-g) = inf for very negative g: silu is -0
        return (g64 / (1.0 + np.exp(-g64))).astype(np.float32) * u


def moe_from_matmul(parts, x, out, expert_index, offsets, token_ids, weights_, impl="auto", act=None, ids=None):
    """The fused call's arithmetic spelled out with matmul_into per expert (pool None). With `act`
    (a MoeAct; expert j's biases from row ids[j]), the clamped SwiGLU: biases after the products,
    down's bias before the weighting."""
    out = out.copy()
    bg, bu, bd = act.tables if act is not None else (None, None, None)
    a0 = offsets[0]
    down = np.zeros((offsets[-1] - a0, parts.n_embd), np.float32)
    for j, e in enumerate(expert_index):
        lo, hi = offsets[j], offsets[j + 1]
        if lo == hi:
            continue
        xe = np.ascontiguousarray(x[token_ids[lo:hi]])
        g = matmul(None, parts.gate.type, parts.gate.matrix(e), parts.n_ff, xe, impl)
        u = matmul(None, parts.up.type, parts.up.matrix(e), parts.n_ff, xe, impl)
        if bg is not None:
            g = g + bg[ids[j]]
        if bu is not None:
            u = u + bu[ids[j]]
        y = matmul(None, parts.down.type, parts.down.matrix(e), parts.n_embd,
                   silu_mul(g, u) if act is None else oai_mul(g, u), impl)
        down[lo - a0:hi - a0] = y if bd is None else y + bd[ids[j]]
    for a in range(a0, offsets[-1]):             # ascending assignment order, one term at a time
        out[token_ids[a]] += weights_[a] * down[a - a0]
    return out


def moe_float64(parts, x, expert_index, offsets, token_ids, weights_):
    out = np.zeros(x.shape, np.float64)
    for j, e in enumerate(expert_index):
        deq = [native.dequantize(p.type, p.matrix(e), (p.n_rows, p.row_len)).astype(np.float64)
               for p in parts]
        for a in range(offsets[j], offsets[j + 1]):
            xt = x[token_ids[a]].astype(np.float64)
            g, u = deq[0] @ xt, deq[1] @ xt
            out[token_ids[a]] += weights_[a] * (deq[2] @ (g / (1 + np.exp(-g)) * u))
    return out


def run_moe(pool, parts, x, out, route, scratch=None, impl="auto"):
    if scratch is None:
        scratch = np.empty(native.moe_scratch_bytes(parts, len(x), len(route[2])), np.uint8)
    return native.moe_swiglu(pool, x, out, parts, *route, scratch, impl=impl)


@pytest.mark.parametrize("shape", MOE_SHAPES, ids=lambda s: "-".join(t.name for t in s[:3]))
def test_moe_equals_matmul_per_expert_for_every_thread_count(pools, shape):
    parts = moe_parts(*shape, pad=64 if shape[0] == T.Q4_0 else 0)
    n_embd = shape[3]
    # T = 64 gives every thread work; small T runs on fewer threads (see test_moe_decode_...).
    cases = [(1, k) for k in range(1, 9)] + [(2, 1), (2, 8), (7, 2), (7, 5), (64, 8), (64, 1)]
    for n_tokens, top_k in cases:
        route = routing(n_tokens, top_k, seed=n_tokens * 10 + top_k)
        x = activations(n_tokens, n_embd, seed=top_k)
        out0 = activations(n_tokens, n_embd, seed=99)          # the call adds into out
        want = moe_from_matmul(parts, x, out0, *route)
        for n in (None, 1, 2, 3, 4):
            got = run_moe(pools[n], parts, x, out0.copy(), route)
            assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), (n_tokens, top_k, n)


@pytest.mark.parametrize("impl", IMPLS)
def test_moe_decode_sized_layer_splits_across_threads(pools, impl):
    """One token, top-8, hidden 1024, FFN 512: enough work for every thread in both phases."""
    parts = moe_parts(T.Q4_0, T.Q4_0, T.Q4_K, 1024, 512, seed=4)
    for top_k in (8, 3):
        route = routing(1, top_k, seed=top_k)
        x = activations(1, 1024, seed=7)
        want = moe_from_matmul(parts, x, np.zeros_like(x), *route, impl=impl)
        for n in (None, 2, 3, 4):
            got = run_moe(pools[n], parts, x, np.zeros_like(x), route, impl=impl)
            assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), (top_k, n)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", MOE_SHAPES[:3], ids=lambda s: "-".join(t.name for t in s[:3]))
def test_moe_close_to_float64(pools, shape, impl):
    parts = moe_parts(*shape, seed=1)
    route = routing(7, 4, seed=5)
    x = activations(7, shape[3], seed=6)
    got = run_moe(pools[2], parts, x, np.zeros_like(x), route, impl=impl)
    want = moe_float64(parts, x, *route)
    # Two activation roundings (x, then h), each within 1/254 of a block's largest value.
    assert np.max(np.abs(got - want)) <= 0.03 * np.max(np.abs(want))
    assert np.max(np.abs(want)) > 0


def test_moe_chunked_calls_add_up(pools):
    parts = moe_parts(*MOE_SHAPES[1])
    expert_index, offsets, token_ids, weights_ = routing(7, 3, seed=8)
    x = activations(7, parts.n_embd)
    whole = run_moe(pools[2], parts, x, np.zeros_like(x), (expert_index, offsets, token_ids, weights_))
    out = np.zeros_like(x)
    scratch = np.empty(native.moe_scratch_bytes(parts, 7, len(token_ids)), np.uint8)
    for lo, hi in [(0, 2), (2, 3), (3, len(expert_index))]:   # slices of the same arrays, in order
        native.moe_swiglu(pools[3], x, out, parts, expert_index[lo:hi], offsets[lo:hi + 1], token_ids, weights_,
                          scratch)
    assert out.view(np.uint32).tobytes() == whole.view(np.uint32).tobytes()


def test_moe_accepts_torch_and_empty_calls(pools):
    parts = moe_parts(*MOE_SHAPES[0])
    route = routing(2, 2, seed=3)
    x = activations(2, parts.n_embd)
    want = run_moe(None, parts, x, np.zeros_like(x), route)
    tx, tout = torch.from_numpy(x), torch.zeros(2, parts.n_embd)
    scratch = torch.empty(native.moe_scratch_bytes(parts, 2, len(route[2])), dtype=torch.uint8)
    native.moe_swiglu(pools[2], tx, tout, parts, *(torch.from_numpy(a) for a in route), scratch)
    assert np.array_equal(tout.numpy(), want)
    none = (np.zeros(0, np.int32), np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32))
    assert not run_moe(pools[2], parts, x, np.zeros_like(x), none, scratch=np.empty(0, np.uint8)).any()


def _refusal_case():
    """Parts, x [3, D], out (ones), scratch and a valid routing of 3 tokens to 2 experts each: the
    calls the refusal tests then spoil one argument of."""
    parts = moe_parts(*MOE_SHAPES[0])
    route = routing(3, 2, seed=2)
    x = activations(3, parts.n_embd)
    return parts, x, np.ones_like(x), np.empty(native.moe_scratch_bytes(parts, 3, len(route[2])), np.uint8), route


def test_moe_refuses_bad_routing(pools):
    parts, x, out, scratch, (expert_index, offsets, token_ids, weights_) = _refusal_case()

    def call(e=expert_index, o=offsets, t=token_ids, w=weights_, s=scratch, p=parts):
        native.moe_swiglu(pools[2], x, out, p, e, o, t, w, s)

    for bad_e in (N_HELD, -1, 1 << 30):
        e = expert_index.copy()
        e[-1] = bad_e
        with pytest.raises(NativeError):
            call(e=e)
    for bad_t in (3, -1):
        t = token_ids.copy()
        t[0] = bad_t
        with pytest.raises(NativeError):
            call(t=t)
    o = offsets.copy()
    o[1], o[2] = o[2], o[1]                                     # not ascending
    with pytest.raises(NativeError):
        call(o=o)
    o = offsets.copy()
    o[-1] += 1                                                  # past the assignments
    with pytest.raises(NativeError):
        call(o=o)
    with pytest.raises(NativeError, match="too small"):
        call(s=scratch[:-65])
    with pytest.raises(ValueError):
        call(o=offsets[:-1])                                    # J experts need J + 1 offsets
    with pytest.raises(ValueError):
        call(t=token_ids.astype(np.int64))
    with pytest.raises(ValueError):
        call(w=weights_[:-1])
    with pytest.raises(ValueError, match="disagree"):
        call(p=native.MoeParts(parts.gate, parts.up, parts.gate))
    small = native.MoePart(parts.gate.matrix(0), T.Q4_0, parts.n_ff, parts.n_embd)   # one expert held
    with pytest.raises(NativeError):
        call(p=native.MoeParts(small, parts.up, parts.down))
    assert np.all(out == 1)                                     # nothing was written


def test_moe_c_checks_below_the_wrapper():
    parts = moe_parts(*MOE_SHAPES[0])
    expert_index, offsets, token_ids, weights_ = routing(2, 2, seed=1)
    x = activations(2, parts.n_embd)
    out = np.zeros_like(x)
    scratch = np.empty(native.moe_scratch_bytes(parts, 2, len(token_ids)), np.uint8)
    f = lambda a: ffi.cast("float *", ffi.from_buffer(a))             # noqa: E731
    ok = [ffi.NULL, f(x), x.nbytes, 2, parts.n_embd, parts.n_ff, parts.gate.c, parts.up.c, parts.down.c,
          len(expert_index), ffi.cast("int32_t *", ffi.from_buffer(expert_index)),
          ffi.cast("int64_t *", ffi.from_buffer(offsets)), ffi.cast("int32_t *", ffi.from_buffer(token_ids)),
          f(weights_), len(token_ids), f(out), out.nbytes, ffi.from_buffer(scratch), scratch.nbytes, 0]
    assert lib.strata_moe_swiglu(*ok) == lib.STRATA_OK
    for i, bad in [(1, ffi.NULL), (2, 4), (3, -1), (4, 48), (5, 0), (6, ffi.NULL), (8, ffi.NULL), (10, ffi.NULL),
                   (11, ffi.NULL), (11, ffi.cast("int64_t *", 4)), (12, ffi.NULL), (13, ffi.NULL), (15, ffi.NULL),
                   (16, 8), (17, ffi.NULL), (18, 64), (19, 42)]:
        args = list(ok)
        args[i] = bad
        assert lib.strata_moe_swiglu(*args) != lib.STRATA_OK, (i, bad)
    with pytest.raises(ValueError, match="whole blocks"):
        native.MoePart(b"", T.Q4_K, 64, 96)
    n = ffi.new("int64_t *")
    assert lib.strata_moe_scratch_bytes(2, 2, int(T.Q4_K), 1, 1, 64, 96, n) == lib.STRATA_E_BLOCK
    assert lib.strata_moe_scratch_bytes(2, 2, 99, 1, 1, 64, 96, n) == lib.STRATA_E_TYPE
    assert lib.strata_moe_scratch_bytes(2, 2, 2, -1, 1, 64, 96, n) == lib.STRATA_E_ARG


@pytest.mark.parametrize("n_tokens,top_k", [(1, 4), (7, 3)])
def test_moe_rows_in_two_calls_then_reduce_equal_one_call(pools, n_tokens, top_k):
    """The experts of a call split between two `rows` calls (the other half skipped with -1 each
    time), then `reduce`: the bytes of one call. Skipped experts' rows are left alone."""
    parts = moe_parts(*MOE_SHAPES[1])
    expert_index, offsets, token_ids, weights_ = routing(n_tokens, top_k, seed=31)
    x = activations(n_tokens, parts.n_embd, seed=32)
    out0 = activations(n_tokens, parts.n_embd, seed=33)
    want = moe_from_matmul(parts, x, out0, expert_index, offsets, token_ids, weights_)
    out = out0.copy()
    call = native.MoeCall(x, out, offsets, token_ids, weights_, len(expert_index))
    scratch = torch.empty(native.moe_scratch_bytes(parts, n_tokens, len(token_ids)), dtype=torch.uint8)
    with pytest.raises(ValueError, match="before any rows call"):
        call.reduce(0, len(expert_index), n_tokens)
    index = expert_index.tolist()
    first = [e if j % 2 == 0 else -1 for j, e in enumerate(index)]
    second = [e if j % 2 == 1 else -1 for j, e in enumerate(index)]
    call.rows(pools[2], parts, [-1] * len(index), 0, n_tokens, scratch)  # every expert skipped: nothing done
    call._rows[:] = np.nan
    call.rows(pools[2], parts, first, 0, n_tokens, scratch)
    odd = np.concatenate([np.arange(offsets[j], offsets[j + 1]) for j in range(1, len(index), 2)] or [[]]).astype(int)
    assert np.isnan(call._rows[odd]).all() and not np.isnan(call._rows[offsets[0]:offsets[1]]).any()
    call.rows(pools[3], parts, second, 0, n_tokens, scratch)
    assert np.array_equal(out, out0)  # rows calls leave out alone
    call.reduce(0, len(index), n_tokens)
    assert out.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()


def test_moe_reduce_c_checks():
    from strata.native._lib import ffi, lib

    rows, out = np.zeros((4, 8), np.float32), np.zeros((2, 8), np.float32)
    tok, w = np.array([0, 1, 1, 5], np.int32), np.ones(4, np.float32)
    f = lambda a: ffi.from_buffer("float *", a)  # noqa: E731
    args = (f(rows), rows.nbytes, ffi.from_buffer("int32_t *", tok), f(w))
    assert lib.strata_moe_reduce(*args, 0, 3, 4, 2, 8, f(out), out.nbytes) == 0
    assert lib.strata_moe_reduce(*args, 0, 4, 4, 2, 8, f(out), out.nbytes) != 0   # token 5 of 2
    assert lib.strata_moe_reduce(*args, 2, 3, 4, 2, 8, f(out), out.nbytes) != 0   # past n_assign
    assert lib.strata_moe_reduce(*args, 0, 3, 5, 2, 8, f(out), out.nbytes) != 0   # rows shorter than 5 x 8
    assert lib.strata_moe_reduce(*args, 0, 3, 4, 2, 8, f(out), out.nbytes - 4) != 0
    assert lib.strata_moe_reduce(ffi.NULL, 0, ffi.NULL, ffi.NULL, 0, 0, 4, 2, 8, ffi.NULL, 0) == 0  # nothing to add


# ---- the fused MoE layer with gpt-oss's clamped SwiGLU (strata_moe_glu) ----

ALPHA, LIMIT = 1.702, 7.0


def oai_mul(g, u, alpha=ALPHA, limit=LIMIT):
    alpha = float(np.float32(alpha))  # the call holds alpha as a float32, widened for the sigmoid
    g64 = np.minimum(g, np.float32(limit)).astype(np.float64)
    u = np.clip(u, np.float32(-limit), np.float32(limit))
    with np.errstate(over="ignore"):
        return (g64 / (1.0 + np.exp(-alpha * g64))).astype(np.float32) * (u + np.float32(1))


def moe_act(parts, n_ids=N_HELD + 3, seed=0, scale=1.0, none=()):
    """A MoeAct with random biases (`none`: the tables left out, by index 0 gate, 1 up, 2 down)."""
    rng = np.random.default_rng(seed)
    tables = [None if i in none else (scale * rng.standard_normal((n_ids, n))).astype(np.float32)
              for i, n in enumerate((parts.n_ff, parts.n_ff, parts.n_embd))]
    return native.MoeAct(*tables, ALPHA, LIMIT)


def act_ids(expert_index, shift=2):
    """Bias rows of a call's experts: not their slots (a slot pool holds any expert anywhere)."""
    return ((expert_index + shift) % (N_HELD + 3)).astype(np.int32)


@pytest.mark.parametrize("shape", MOE_SHAPES, ids=lambda s: "-".join(t.name for t in s[:3]))
def test_moe_clamped_swiglu_equals_matmul_per_expert(pools, shape):
    parts = moe_parts(*shape, seed=2)
    act = moe_act(parts, scale=2.0)  # large biases: both clamps bite
    for n_tokens, top_k in [(1, 4), (2, 8), (7, 3), (64, 2)]:
        route = routing(n_tokens, top_k, seed=n_tokens + 40 * top_k)
        ids = act_ids(route[0])
        x = activations(n_tokens, parts.n_embd, seed=top_k) * 40   # large products too
        out0 = activations(n_tokens, parts.n_embd, seed=5)
        want = moe_from_matmul(parts, x, out0, *route, act=act, ids=ids)
        scratch = np.empty(native.moe_scratch_bytes(parts, n_tokens, len(route[2])), np.uint8)
        for n in (None, 1, 2, 3):
            got = native.moe_swiglu(pools[n], x, out0.copy(), parts, *route, scratch, act=act, ids=ids)
            assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), (n_tokens, top_k, n)
        g = np.concatenate([matmul(None, parts.gate.type, parts.gate.matrix(e), parts.n_ff, x) for e in route[0]])
        assert (g + act.tables[0][ids].repeat(n_tokens, 0) > LIMIT).any() or n_tokens == 1


def test_moe_clamped_swiglu_close_to_float64(pools):
    parts = moe_parts(*MOE_SHAPES[1], seed=3)
    act = moe_act(parts, seed=4)
    route = routing(7, 4, seed=6)
    ids = act_ids(route[0])
    x = activations(7, parts.n_embd, seed=8) * 0.03  # gate products of a few units: the clamps' range
    scratch = np.empty(native.moe_scratch_bytes(parts, 7, len(route[2])), np.uint8)
    got = native.moe_swiglu(pools[2], x, np.zeros_like(x), parts, *route, scratch, act=act, ids=ids)
    want = np.zeros(x.shape, np.float64)
    bg, bu, bd = (t.astype(np.float64) for t in act.tables)
    expert_index, offsets, token_ids, weights_ = route
    clamped = [0, 0]
    for j, e in enumerate(expert_index):
        deq = [native.dequantize(p.type, p.matrix(e), (p.n_rows, p.row_len)).astype(np.float64) for p in parts]
        for a in range(offsets[j], offsets[j + 1]):
            xt = x[token_ids[a]].astype(np.float64)
            g, u = deq[0] @ xt + bg[ids[j]], deq[1] @ xt + bu[ids[j]]
            clamped[0] += int(np.sum(g > LIMIT))
            clamped[1] += int(np.sum(np.abs(u) > LIMIT))
            g, u = np.minimum(g, LIMIT), np.clip(u, -LIMIT, LIMIT)
            want[token_ids[a]] += weights_[a] * (deq[2] @ ((u + 1) * g / (1 + np.exp(-ALPHA * g))) + bd[ids[j]])
    assert np.max(np.abs(got - want)) <= 0.03 * np.max(np.abs(want))
    assert min(clamped) > 0  # both clamps were exercised


def test_moe_clamped_swiglu_rows_reduce_and_missing_tables(pools):
    """The two-call form (rows of the experts in memory, then the rest, then the sum) gives the
    bytes of one call through MoeCall; tables left out add nothing."""
    parts = moe_parts(*MOE_SHAPES[0], seed=5)
    expert_index, offsets, token_ids, weights_ = routing(7, 3, seed=9)
    ids = act_ids(expert_index, shift=5)
    x = activations(7, parts.n_embd, seed=10)
    scratch = torch.empty(native.moe_scratch_bytes(parts, 7, len(token_ids)), dtype=torch.uint8)
    for none in ((), (0,), (1, 2), (0, 1, 2)):
        act = moe_act(parts, seed=6, none=none)
        want = moe_from_matmul(parts, x, np.zeros_like(x), expert_index, offsets, token_ids, weights_, act=act, ids=ids)
        out = np.zeros_like(x)
        call = native.MoeCall(x, out, offsets, token_ids, weights_, len(expert_index), act=act, ids=ids)
        call(pools[2], parts, expert_index.tolist(), 0, 7, scratch)
        assert out.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), none
        out[:] = 0
        index = expert_index.tolist()
        call.rows(pools[2], parts, [e if j % 2 else -1 for j, e in enumerate(index)], 0, 7, scratch)
        call.rows(pools[2], parts, [-1 if j % 2 else e for j, e in enumerate(index)], 0, 7, scratch)
        call.reduce(0, len(index), 7)
        assert out.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), none
    if len(index) > 2:  # a call over later experts reads their ids from the same offset
        out[:] = 0
        call(pools[2], parts, index[:2], 0, 7, scratch)
        call(pools[2], parts, index[2:], 2, 7, scratch)
        assert out.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()


def test_moe_clamped_swiglu_refusals(pools):
    parts, x, out, scratch, (expert_index, offsets, token_ids, weights_) = _refusal_case()
    act = moe_act(parts, n_ids=N_HELD)
    for bad in (N_HELD, -1):
        ids = act_ids(expert_index)
        ids[-1] = bad
        with pytest.raises(NativeError):
            native.moe_swiglu(pools[2], x, out, parts, expert_index, offsets, token_ids, weights_, scratch,
                              act=act, ids=ids)
    with pytest.raises(ValueError, match="ids"):
        native.moe_swiglu(pools[2], x, out, parts, expert_index, offsets, token_ids, weights_, scratch,
                          act=act, ids=act_ids(expert_index)[:-1])
    with pytest.raises(ValueError, match="widths"):
        native.moe_swiglu(pools[2], x, out, parts, expert_index, offsets, token_ids, weights_, scratch,
                          act=native.MoeAct(np.zeros((4, parts.n_ff + 1), np.float32), None, None, ALPHA, LIMIT),
                          ids=act_ids(expert_index))
    with pytest.raises(ValueError, match="limit"):
        native.MoeAct(None, None, None, ALPHA, 0.0)
    with pytest.raises(ValueError, match="bias tables"):
        native.MoeAct(np.zeros((4, 8), np.float32), np.zeros((5, 8), np.float32), None, ALPHA, LIMIT)
    assert np.all(out == 1)
    # Below the wrapper: exactly one of out and rows; a NaN limit; no ids.
    f = lambda a: ffi.cast("float *", ffi.from_buffer(a))             # noqa: E731
    c = ffi.new("strata_moe_act *", act.c[0])
    c.expert_ids = ffi.cast("int32_t *", ffi.from_buffer(act_ids(expert_index)))
    head = [ffi.NULL, f(x), x.nbytes, 3, parts.n_embd, parts.n_ff, parts.gate.c, parts.up.c, parts.down.c,
            len(expert_index), ffi.cast("int32_t *", ffi.from_buffer(expert_index)),
            ffi.cast("int64_t *", ffi.from_buffer(offsets)), ffi.cast("int32_t *", ffi.from_buffer(token_ids)),
            f(weights_), len(token_ids)]
    tail = [ffi.from_buffer(scratch), scratch.nbytes, 0]
    rows = np.zeros((len(token_ids), parts.n_embd), np.float32)
    assert lib.strata_moe_glu(*head, c, f(out), out.nbytes, ffi.NULL, 0, *tail) == lib.STRATA_OK
    assert lib.strata_moe_glu(*head, c, ffi.NULL, 0, f(rows), rows.nbytes, *tail) == lib.STRATA_OK
    assert lib.strata_moe_glu(*head, c, f(out), out.nbytes, f(rows), rows.nbytes, *tail) != lib.STRATA_OK
    assert lib.strata_moe_glu(*head, c, ffi.NULL, 0, ffi.NULL, 0, *tail) != lib.STRATA_OK
    c.limit = float("nan")
    assert lib.strata_moe_glu(*head, c, f(out), out.nbytes, ffi.NULL, 0, *tail) != lib.STRATA_OK
    c.limit, c.expert_ids = LIMIT, ffi.NULL
    assert lib.strata_moe_glu(*head, c, f(out), out.nbytes, ffi.NULL, 0, *tail) != lib.STRATA_OK
    plain = np.zeros_like(x)
    assert lib.strata_moe_glu(*head, ffi.NULL, f(plain), plain.nbytes, ffi.NULL, 0, *tail) == lib.STRATA_OK
    assert plain.tobytes() == run_moe(None, parts, x, np.zeros_like(x), (expert_index, offsets, token_ids,
                                                                          weights_)).tobytes()


# ---- per-head products (latent attention's k_b and v_b) ----

@pytest.mark.parametrize("t,n_rows,row_len", [(T.Q8_0, 48, 64), (T.Q4_K, 20, 256), (T.F16, 33, 40), (T.F32, 16, 8)])
@pytest.mark.parametrize("n_tokens", [1, 3, 17])
def test_matmul_heads_equals_matmul_per_head(pools, t, n_rows, row_len, n_tokens):
    """Each head's rows times that head's activations, x and y strided views inside wider rows (as
    the latent query's nope part and the attention's latent part are): strata_matmul's bytes per
    head, whatever the thread count."""
    H = 5
    w = weights(t, H * n_rows, row_len, seed=n_rows)
    per_head = w.size // H
    wide = torch.from_numpy(activations(n_tokens, H * (row_len + 7), seed=n_tokens)).view(n_tokens, H, row_len + 7)
    x = wide[:, :, 3:3 + row_len]                                      # [T, H, K] inside wider rows
    want = np.stack([matmul(None, t, w[h * per_head:(h + 1) * per_head], n_rows, np.ascontiguousarray(x[:, h].numpy()))
                     for h in range(H)], axis=1)                       # [T, H, n_rows]
    scratch = torch.empty(native.matmul_heads_scratch_bytes(t, H, n_tokens, row_len), dtype=torch.uint8)
    for n in (None, 1, 2, 3):
        out = torch.full((n_tokens, H, n_rows + 2), float("nan"))
        native.matmul_heads(pools[n], t, w, H, n_rows, row_len, x, out[:, :, 1:1 + n_rows], scratch)
        assert out[:, :, 1:1 + n_rows].numpy().tobytes() == want.tobytes(), n
        assert torch.isnan(out[:, :, 0]).all() and torch.isnan(out[:, :, -1]).all()  # nothing outside y written


def test_matmul_heads_refuses_what_does_not_fit(pools):
    H, n_rows, row_len, n_tokens = 3, 16, 64, 2
    w = weights(T.Q8_0, H * n_rows, row_len)
    x, y = torch.randn(n_tokens, H, row_len), torch.empty(n_tokens, H, n_rows)
    scratch = torch.empty(native.matmul_heads_scratch_bytes(T.Q8_0, H, n_tokens, row_len), dtype=torch.uint8)
    native.matmul_heads(pools[2], T.Q8_0, w, H, n_rows, row_len, x, y, scratch)
    with pytest.raises(NativeError, match="per-head product"):  # weights for 2 heads, 3 asked
        native.matmul_heads(pools[2], T.Q8_0, w[:w.size * 2 // 3], H, n_rows, row_len, x, y, scratch)
    with pytest.raises(NativeError, match="per-head product"):  # scratch one byte short
        native.matmul_heads(pools[2], T.Q8_0, w, H, n_rows, row_len, x, y, scratch[:-1])
    f = lambda a: ffi.cast("float *", a.data_ptr())                   # noqa: E731
    args = [ffi.NULL, int(T.Q8_0), ffi.from_buffer(w), w.nbytes, H, n_rows, row_len, f(x), x.numel() * 4, H * row_len,
            row_len, n_tokens, f(y), y.numel() * 4, H * n_rows, n_rows, ffi.cast("void *", scratch.data_ptr()),
            scratch.numel(), 0]
    assert lib.strata_matmul_heads(*args) == lib.STRATA_OK
    for i, bad in [(8, x.numel() * 4 - 4), (13, y.numel() * 4 - 4), (9, -1), (15, -2), (6, 0), (7, ffi.NULL)]:
        a = list(args)                                                  # x or y past its bytes, bad strides ...
        a[i] = bad
        assert lib.strata_matmul_heads(*a) != lib.STRATA_OK, i
    with pytest.raises(ValueError, match="contiguous rows"):
        native.matmul_heads(pools[2], T.Q8_0, w, H, n_rows, row_len, x.transpose(1, 2), y, scratch)
    with pytest.raises(ValueError, match="heads"):
        native.matmul_heads(pools[2], T.Q8_0, w, H - 1, n_rows, row_len, x, y, scratch)
