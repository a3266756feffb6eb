"""Quantized matrix kernels (native/kernels/) against numpy and float64, through the table's choice for
each family, and their entry points.

y = x @ W^T is computed from W's packed blocks after x is rounded to 8-bit activation blocks
(d = max|x| / 127 per block of 32 or 256, q = round-half-even(x / d)). The tests hold it to:

(c) the activation quantizer equals a numpy re-implementation bit for bit, in every family;
(b) the bounds of float rounding and activation rounding against float64 (tests/native/qdot_cases.py),
    for every type of the table and every family this CPU runs, on weights with extreme scales:
    zero, subnormal, tiny, 65504 (and E8M0 exponents 0, 1, 140; NVFP4's extreme UE4M3 codes);
(d) through the pooled `strata_matmul` (1-3 threads, decode and prefill token counts) bit for bit
    the single-threaded product, and through the fused MoE call with a different type in each of
    gate, up and down.
Every tile against its scalar twin: test_qdot_tiles.py; the choice of tile: test_qdot_choice.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from strata import native
from strata.errors import NativeError
from strata.native._lib import ffi, lib
from strata.quant import DEQUANT_TYPES, IQ_TYPES, GGMLType, block_size, random_blocks
from tests.native import test_matmul as tm
from tests.native.qdot_cases import (ALL, CASE_IDS, CASES, FLOAT_TYPES, SCALES, U, act_block,  # noqa: F401
                                     assert_within_bounds, dequantize, magnitude, make_tokens, make_weights,
                                     numpy_qact, row_len_of)
from tests.native.test_matmul import pools  # noqa: F401  (the fixture)

T = GGMLType
HAS = {"scalar": True, "avx2": native.cpu_has_avx2(), "avx512": native.cpu_has_avx512()}
IMPLS = [pytest.param(f, marks=pytest.mark.skipif(not HAS[f], reason=f"CPU (or OS) without {f}")) for f in HAS]
#: The formats older than the i-quants (test_simd_composites.py reads these names).
ALL_TYPES = tuple(t for t in ALL if t not in IQ_TYPES)


def test_every_dequantized_format_has_a_kernel():
    assert set(ALL_TYPES) | set(IQ_TYPES) == set(DEQUANT_TYPES) == set(ALL)
    for t in DEQUANT_TYPES:
        assert native.has_qdot_kernel(t, "scalar") and native.has_qdot_kernel(t, "avx2"), t.name


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("t", ALL, ids=lambda t: t.name)
def test_activation_quantizer_matches_numpy(t, impl):
    rng = np.random.default_rng(int(t) + 100)
    k = 3 * 256
    x = make_tokens(6, k, rng)
    x[4] = rng.standard_normal(k).astype(np.float32) * np.float32(1e-40)   # subnormal values: d rounds
    x[5, :300] = np.float32(2.0 ** -140) * rng.integers(-130, 131, 300)    # subnormal d, clamped codes
    expected, _, _ = numpy_qact(t, x)
    found = native.quantize_act(t, x, impl=impl)
    assert found.shape == expected.shape
    bad = np.flatnonzero((found != expected).any(axis=0))
    assert bad.size == 0, f"{t.name} {impl}: activation bytes differ from numpy at row offsets {bad[:8]}"


@pytest.mark.skipif(not HAS["avx512"], reason="CPU (or OS) without AVX-512 F/BW/VL/VNNI")
@pytest.mark.parametrize("t", [T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_avx512_activation_blocks_are_bytes_of_scalar(t):
    rng = np.random.default_rng(int(t))
    row_len = 2048
    rows = [rng.standard_normal(row_len) * s for s in (1.0, 1e-3, 1e30, 1e-38, 3e-43, 1e-44)]
    x = np.stack(rows).astype(np.float32)
    x[0, :300] = 0.0
    x[1, 5] = -1e3
    x[2, ::3] = -x[2, ::3]
    x[3, 7] = 2.5e-43                 # d is a float32 subnormal; x / d may round past 127 and wrap
    got = native.quantize_act(t, x, impl="avx512")
    ref = native.quantize_act(t, x, impl="scalar")
    assert got.shape == ref.shape
    assert np.array_equal(got, ref), f"{t.name}: rows {np.flatnonzero((got != ref).any(axis=1)).tolist()} differ"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("t", ALL, ids=lambda t: t.name)
def test_qdot_within_bounds_of_float64(t, case, impl):
    n_rows, n_blocks, n_tok = case
    rng = np.random.default_rng(int(t) * 1000 + n_rows * 10 + n_tok)
    row_len = row_len_of(t, n_blocks)
    w = make_weights(t, n_rows, row_len, rng)
    x = make_tokens(n_tok, row_len, rng)
    y = native.qdot_rows(t, w, n_rows, row_len, x, impl=impl).astype(np.float64)
    wd = dequantize(t, w, n_rows, row_len)
    if t in IQ_TYPES:
        assert np.isfinite(wd).all()
    assert_within_bounds(t, impl, y, x, wd, magnitude(t, w, n_rows, row_len))


@pytest.mark.parametrize("impl", ["auto", *IMPLS[1:]])
@pytest.mark.parametrize("t", ALL, ids=lambda t: t.name)
def test_pooled_matmul_equals_the_kernels_for_every_thread_count(pools, t, impl):  # noqa: F811
    """Decode and prefill counts; the last row count splits into several 16-row blocks per thread
    (64 KiB of work or more)."""
    row_len = 768
    scale = SCALES.get(t, 0.01)
    for n_tokens in (1, 2, 3, 8, 9, 33, 64):
        for n_rows in (1, 17, 97, -(-tm.SPLIT_WORK // (row_len // block_size(t)[0] * block_size(t)[1] * n_tokens)) | 1):
            w = random_blocks(t, n_rows * row_len // block_size(t)[0], np.random.default_rng(n_rows), scale)
            x = tm.activations(n_tokens, row_len, seed=n_tokens)
            want = native.qdot_rows(t, w, n_rows, row_len, x, impl=impl)
            for n in (None, 1, 2, 3):
                got = tm.matmul(pools[n], t, w, n_rows, x, impl=impl)
                assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), (t.name, n_rows, n_tokens, n)


MOE_SHAPES = [  # gate, up, down (each a different new type), n_embd D, n_ff F
    (T.IQ2_XXS, T.IQ3_S, T.IQ4_XS, 256, 256),
    (T.IQ1_M, T.TQ2_0, T.IQ4_NL, 256, 256),
    (T.IQ2_S, T.IQ1_S, T.TQ1_0, 256, 256),
    (T.IQ2_XS, T.IQ3_XXS, T.NVFP4, 256, 256),
    (T.Q4_K, T.IQ4_NL, T.IQ2_XXS, 256, 256),
]


def _moe_parts(gate, up, down, D, F, seed):
    """tm.moe_parts with weights scaled for each type (its random codes span different ranges)."""
    rng = np.random.default_rng(seed)
    parts = []
    for t, n_rows, row_len in ((gate, F, D), (up, F, D), (down, D, F)):
        data = random_blocks(t, tm.N_HELD * n_rows * row_len // block_size(t)[0], rng, SCALES.get(t, 0.01))
        parts.append(native.MoePart(data, t, n_rows, row_len))
    return native.MoeParts(*parts)


@pytest.mark.parametrize("shape", MOE_SHAPES, ids=lambda s: "-".join(t.name for t in s[:3]))
def test_moe_with_mixed_new_types(pools, shape):  # noqa: F811
    parts = _moe_parts(*shape, seed=1)
    route = tm.routing(7, 4, seed=5)
    x = tm.activations(7, shape[3], seed=6)
    got = tm.run_moe(pools[2], parts, x, np.zeros_like(x), route)
    for n in (1, 3):
        again = tm.run_moe(pools[n], parts, x, np.zeros_like(x), route)
        assert np.array_equal(got.view(np.uint32), again.view(np.uint32)), n
    want = tm.moe_float64(parts, x, *route)
    # Two activation roundings (x, then h), each within 1/254 of a block's largest value.
    assert np.max(np.abs(got - want)) <= 0.03 * np.max(np.abs(want))
    assert np.max(np.abs(want)) > 0


def test_torch_input_gives_torch_output():
    rng = np.random.default_rng(1)
    w = make_weights(T.Q8_0, 3, 64, rng)
    x = torch.from_numpy(make_tokens(2, 64, rng))
    y = native.qdot_rows(T.Q8_0, w, 3, 64, x)
    assert isinstance(y, torch.Tensor) and y.shape == (2, 3)
    assert np.array_equal(y.numpy(), native.qdot_rows(T.Q8_0, w, 3, 64, x.numpy()))


def _raw_call(t=T.Q8_0, n_rows=2, row_len=64, n_tok=2, w_bytes=None, x_bytes=None, y_bytes=None,
              s_bytes=None, impl=1, null_w=False):
    """strata_qdot_rows on buffers of the right size unless a size is overridden; the status."""
    wb = max(n_rows, 0) * row_len // block_size(t)[0] * block_size(t)[1]
    w = np.zeros(max(wb, 1), np.uint8)
    x = np.zeros((n_tok, max(row_len, 1)), np.float32)
    y = np.zeros((n_tok, max(n_rows, 1)), np.float32)
    sb = native.qdot.scratch_bytes(t, n_tok, row_len) if row_len % block_size(t)[0] == 0 else 0
    s = np.zeros(max(sb, 4), np.uint8)
    return lib.strata_qdot_rows(int(t), ffi.NULL if null_w else ffi.from_buffer(w),
                                wb if w_bytes is None else w_bytes, n_rows, row_len,
                                ffi.cast("float *", ffi.from_buffer(x)), x.nbytes if x_bytes is None else x_bytes,
                                n_tok, ffi.cast("float *", ffi.from_buffer(y, require_writable=True)),
                                y.nbytes if y_bytes is None else y_bytes, ffi.from_buffer(s, require_writable=True),
                                sb if s_bytes is None else s_bytes, impl)


def test_every_buffer_size_is_checked():
    assert _raw_call() == lib.STRATA_OK
    wb = 2 * 2 * 34
    assert _raw_call(w_bytes=wb - 1) == lib.STRATA_E_SIZE
    assert _raw_call(x_bytes=2 * 64 * 4 - 1) == lib.STRATA_E_SIZE
    assert _raw_call(y_bytes=2 * 2 * 4 - 1) == lib.STRATA_E_SIZE
    assert _raw_call(s_bytes=2 * 2 * 40 - 1) == lib.STRATA_E_SIZE
    assert _raw_call(row_len=48) == lib.STRATA_E_BLOCK
    assert _raw_call(n_rows=-1) == lib.STRATA_E_ARG
    assert _raw_call(null_w=True) == lib.STRATA_E_ARG
    assert _raw_call(impl=99) == lib.STRATA_E_ARG
    assert _raw_call(t=T.Q4_K, row_len=256) == lib.STRATA_OK
    assert _raw_call(t=T.Q4_K, row_len=128) == lib.STRATA_E_BLOCK
    assert lib.strata_qdot_rows(int(T.Q8_1), ffi.NULL, 0, 0, 32, ffi.NULL, 0, 0, ffi.NULL, 0, ffi.NULL, 0, 1) == lib.STRATA_E_TYPE
    out = ffi.new("int64_t *")
    assert lib.strata_qdot_scratch_bytes(int(T.Q6_K), 3, 512, out) == lib.STRATA_OK and out[0] == 3 * 2 * 292
    assert lib.strata_qdot_scratch_bytes(int(T.F16), 3, 512, out) == lib.STRATA_OK and out[0] == 0
    assert lib.strata_qdot_scratch_bytes(int(T.Q8_0), 2 ** 62, 2 ** 20, out) == lib.STRATA_E_SIZE


def test_wrapper_errors_name_the_problem():
    rng = np.random.default_rng(2)
    w = make_weights(T.Q4_0, 4, 64, rng)
    with pytest.raises(ValueError, match=r"needs 144 packed bytes, found 72"):
        native.qdot_rows(T.Q4_0, w.reshape(-1)[:72], 4, 64, make_tokens(1, 64, rng))
    with pytest.raises(ValueError, match=r"shape \[T, 64\]"):
        native.qdot_rows(T.Q4_0, w, 4, 64, make_tokens(1, 32, rng))
    with pytest.raises(ValueError, match="not a multiple of the block size"):
        native.qdot_rows(T.Q4_0, w, 4, 48, make_tokens(1, 48, rng))
    with pytest.raises(NativeError, match="qdot"):
        native.qdot.scratch_bytes(T.Q4_K, 1, 100)
    with pytest.raises(NativeError, match="Q4_0 weight .* by its kz tile"):   # the table names no such tile
        native.qdot_rows(T.Q4_0, w, 4, 64, make_tokens(1, 64, rng), tile="kz")


@pytest.mark.skipif(HAS["avx512"], reason="this CPU has AVX-512: the request is granted")
def test_avx512_request_on_a_cpu_without_it_is_refused():
    x = np.ones((2, 64), np.float32)
    w = random_blocks(T.Q4_0, 4, np.random.default_rng(0))
    with pytest.raises(NativeError, match="not available on this CPU"):
        native.qdot_rows(T.Q4_0, w, 2, 64, x, impl="avx512")
    with pytest.raises(NativeError, match="not available on this CPU"):
        native.qdot_rows(T.Q4_0, w, 2, 64, x, tile="avx512")
    with pytest.raises(NativeError, match="not available on this CPU"):
        native.quantize_act(T.Q4_K, np.ones((1, 256), np.float32), impl="avx512")
    with pytest.raises(NativeError, match="not available on this CPU"):
        native.dequantize(T.Q4_0, w, (2, 64), impl="avx512")
    with pytest.raises(NativeError, match="not available on this CPU"):
        native.quantize(T.Q4_K, np.ones((1, 256), np.float32), impl="avx512")


@pytest.mark.skipif(not HAS["avx512"], reason="CPU (or OS) without AVX-512 F/BW/VL/VNNI")
def test_avx512_dequant_and_quantize_run_the_avx2_kernels():
    rng = np.random.default_rng(3)
    for t in DEQUANT_TYPES:
        elems, _ = block_size(t)
        src = random_blocks(t, 8 * (1024 // elems), rng)
        a = native.dequantize(t, src, (8, 1024), impl="avx512")
        b = native.dequantize(t, src, (8, 1024), impl="avx2")
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), t.name
    x = rng.standard_normal((4, 1024)).astype(np.float32)
    for t in (T.Q8_0, T.Q4_K, T.Q6_K):
        assert np.array_equal(native.quantize(t, x, impl="avx512"), native.quantize(t, x, impl="avx2")), t.name


def test_avx512_reports_the_avx2_dequant_kernels():
    for t in DEQUANT_TYPES:
        assert native.has_kernel(t, "avx512") == native.has_kernel(t, "avx2"), t.name
