"""Quantized matrix kernels (native/qdot*.c) against numpy, float64 and each other.

y = x @ W^T is computed from W's packed blocks after x is rounded to 8-bit activation blocks
(d = max|x| / 127 per block of 32 or 256, q = round-half-even(x / d)). The tests hold it to:

(c) the activation quantizer equals a numpy re-implementation bit for bit, in both families;
(b) with A = d * q the rounded activations (A = x for F32/F16/BF16 weights), W = gguf.quants'
    dequantization, u = 2^-24 and n = blocks per row + 16 (row length + 16 for float weights):
      |y - W @ A| <= n * u * (|W|' @ |A|) + n * 2^-140                   (float rounding only)
      |y - W @ x| <= sum_i |W_i| * d_i / 2 * (1 + 2^-15) + the bound above (activation rounding)
    where |W|' = |W| for symmetric formats and |W - W0| + |W0| for formats with a min (W0: the
    block with its codes zeroed, i.e. the min), since their integer and min parts are rounded
    apart; (1 + 2^-15) covers the rounding of x / d before it is rounded to an integer;
(a) AVX2 == scalar bit for bit where AVX2 has no kernel of its own; else within twice the
    float-rounding bound (both are within it of the exact W @ A; only the order of the float
    additions differs, the integer block sums are exact in both).
Weights carry extreme scales: zero, subnormal, tiny, 65504 (and E8M0 exponents 0, 1, 140).
"""
from __future__ import annotations

import gguf.quants
import numpy as np
import pytest
import torch

from strata import native
from strata.errors import NativeError
from strata.native._lib import ffi, lib
from strata.quant import DEQUANT_TYPES, IQ_TYPES, GGMLType, block_size

T = GGMLType
U = 2.0 ** -24
AVX2 = pytest.mark.skipif(not native.cpu_has_avx2(), reason="CPU has no AVX2/FMA/F16C")
IMPLS = ["scalar", pytest.param("avx2", marks=AVX2)]

FLOAT_TYPES = (T.F32, T.F16, T.BF16)
Q8_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4)          # activation blocks of 32
Q8K_TYPES = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)                   # activation blocks of 256
ALL_TYPES = FLOAT_TYPES + Q8_TYPES + Q8K_TYPES
# Byte ranges of the codes of formats with a min (zeroing them leaves the min alone).
CODE_BYTES = {T.Q4_1: (4, 20), T.Q5_1: (4, 24), T.Q2_K: (16, 80), T.Q4_K: (16, 144), T.Q5_K: (16, 176)}
# Offsets of half scale fields; MXFP4's E8M0 exponent is byte 0.
HALF_FIELDS = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,), T.Q2_K: (80, 82),
               T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}
# Zero, -0, smallest and largest subnormal, smallest normal, tiny, 65504, -65504.
EXTREME_HALVES = np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x0C00, 0x7BFF, 0xFBFF], dtype="<u2")
EXTREME_E8M0 = np.array([0, 1, 2, 100, 140], dtype=np.uint8)

# (rows, blocks per row, tokens): rows not a multiple of the kernels' row groups (4, 2), one block
# and many (9, 17: windows of 8 blocks of the prefill over unpacked rows), T in {1, 2, 3, 4, 5, 7, 9, 13,
# 64}. Float formats use the "blocks" as a row length (1, 3: tail path).
CASES = [(5, 1, 1), (13, 3, 1), (7, 1, 2), (3, 2, 3), (6, 3, 7), (9, 2, 13), (33, 2, 64), (4, 5, 4), (6, 9, 5),
         (7, 17, 9)]
CASE_IDS = [f"N{n}-B{b}-T{t}" for n, b, t in CASES]


def row_len_of(t: GGMLType, n_blocks: int) -> int:
    return {1: 1, 3: 37, 2: 64, 5: 263}.get(n_blocks, n_blocks) if t in FLOAT_TYPES else n_blocks * block_size(t)[0]


def make_weights(t: GGMLType, n_rows: int, row_len: int, rng: np.random.Generator) -> np.ndarray:
    """[n_rows, row bytes] uint8: quantized by gguf where it can, random codes otherwise; ~30% of
    blocks get an extreme scale."""
    elems, nbytes = block_size(t)
    n_blocks = n_rows * row_len // elems
    if t in FLOAT_TYPES:
        w = rng.standard_normal((n_rows, row_len)).astype(np.float32) * np.float32(10.0) ** rng.uniform(-3, 3, (n_rows, 1)).astype(np.float32)
        special = {T.F32: [0.0, 1e-40, 3e30], T.F16: [0.0, 6e-8, 65504.0], T.BF16: [0.0, 1e-30, 1e30]}[t]
        flat = w.reshape(-1)
        flat[rng.integers(0, flat.size, size=max(1, flat.size // 10))] = rng.choice(special, size=max(1, flat.size // 10))
        return gguf.quants.quantize(w, t).view(np.uint8).reshape(n_rows, -1)
    if t in Q8_TYPES:
        x = rng.standard_normal((n_blocks, elems)).astype(np.float32) * np.float32(10.0) ** rng.uniform(-4, 2, (n_blocks, 1)).astype(np.float32)
        blocks = gguf.quants.quantize(x, t).view(np.uint8).reshape(n_blocks, nbytes).copy()
    else:
        blocks = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
        for off in HALF_FIELDS[t]:
            halves = rng.uniform(2.0 ** -10, 1.0, n_blocks).astype(np.float16)
            blocks[:, off:off + 2] = halves.view(np.uint8).reshape(n_blocks, 2)
    picked = rng.random(n_blocks) < 0.3
    if t == T.MXFP4:
        blocks[picked, 0] = rng.choice(EXTREME_E8M0, size=int(picked.sum()))
    else:
        for off in HALF_FIELDS[t]:
            chosen = rng.choice(EXTREME_HALVES, size=int(picked.sum()))
            blocks[picked, off:off + 2] = chosen.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(n_rows, -1)


def make_tokens(n_tokens: int, row_len: int, rng: np.random.Generator) -> np.ndarray:
    """[T, K] float32 of mixed magnitudes; with T > 1 one row is zero, one has a zero stretch, and
    with T >= 4 one row is tiny (1e-30, still normal after / 127)."""
    x = rng.standard_normal((n_tokens, row_len)).astype(np.float32)
    x *= np.float32(10.0) ** rng.uniform(-2, 2, (n_tokens, 1)).astype(np.float32)
    if n_tokens > 1:
        x[1] = 0.0
        x[0, : min(row_len, 40)] = 0.0
    if n_tokens >= 4:
        x[3] *= np.float32(1e-30)
    return x


def dequantize(t: GGMLType, w: np.ndarray, n_rows: int, row_len: int) -> np.ndarray:
    return gguf.quants.dequantize(w, t).reshape(n_rows, row_len).astype(np.float64)


def magnitude(t: GGMLType, w: np.ndarray, n_rows: int, row_len: int) -> np.ndarray:
    """|W|', see the module docstring."""
    wd = dequantize(t, w, n_rows, row_len)
    if t not in CODE_BYTES:
        return np.abs(wd)
    lo, hi = CODE_BYTES[t]
    blocks = w.reshape(-1, block_size(t)[1]).copy()
    blocks[:, lo:hi] = 0
    w0 = dequantize(t, blocks, n_rows, row_len)
    return np.abs(wd - w0) + np.abs(w0)


# ---- numpy re-implementation of the activation quantizers ----

ACT_Q8 = np.dtype([("d", "<f4"), ("s", "<f4"), ("q", "i1", 32)])
ACT_Q8K = np.dtype([("d", "<f4"), ("q", "i1", 256), ("bsums", "<i2", 16)])


def act_block(t: GGMLType) -> int:
    return 1 if t in FLOAT_TYPES else 32 if t in Q8_TYPES or t in (T.IQ4_NL, T.NVFP4) else 256


def numpy_qact(t: GGMLType, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(activation bytes [T, row bytes], d per block [T, K / blk], A = d * q as float64 [T, K])."""
    n_tok, k = x.shape
    if t in FLOAT_TYPES:
        return x.view(np.uint8).reshape(n_tok, -1), np.zeros((n_tok, k)), x.astype(np.float64)
    blk = act_block(t)
    xb = x.reshape(n_tok, k // blk, blk)
    d = (np.abs(xb).max(axis=-1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = xb / d[..., None]
    q = np.where(d[..., None] == 0, 0, np.clip(np.rint(v), -127, 127)).astype(np.int8)
    out = np.zeros((n_tok, k // blk), dtype=ACT_Q8 if blk == 32 else ACT_Q8K)
    out["d"], out["q"] = d, q
    if blk == 32:
        out["s"] = (d * q.astype(np.int32).sum(-1).astype(np.float32)).astype(np.float32)
    else:
        out["bsums"] = q.reshape(n_tok, k // blk, 16, 16).astype(np.int32).sum(-1).astype(np.int16)
    a = (d[..., None].astype(np.float64) * q).reshape(n_tok, k)
    return out.view(np.uint8).reshape(n_tok, -1), d, a


# ---- tests ----

def test_every_dequantized_format_has_a_kernel():
    """Here ALL_TYPES; the i-quants, ternary formats and NVFP4 (scalar kernels only): test_qdot_iquants.py."""
    assert set(ALL_TYPES) | set(IQ_TYPES) == set(DEQUANT_TYPES)
    for t in DEQUANT_TYPES:
        assert native.has_qdot_kernel(t, "scalar")
    assert all(native.has_qdot_kernel(t, "avx2") for t in ALL_TYPES)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
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


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_qdot_within_bounds_of_float64(t, case, impl):
    w, x, y = qdot_case(t, case, impl, make_weights, row_len_of)
    n_rows, row_len = w.shape[0], x.shape[1]
    assert_within_bounds(t, impl, y, x, dequantize(t, w, n_rows, row_len), magnitude(t, w, n_rows, row_len))


def qdot_case(t: GGMLType, case: tuple[int, int, int], impl: str, make_weights, row_len_of):
    """(w [N, row bytes], x [T, K], y [T, N] float64) of one CASES entry: weights from the test
    module's `make_weights`, random tokens and the kernel's products."""
    n_rows, n_blocks, n_tok = case
    rng = np.random.default_rng(int(t) * 1000 + n_rows * 10 + n_tok)
    row_len = row_len_of(t, n_blocks)
    w = make_weights(t, n_rows, row_len, rng)
    x = make_tokens(n_tok, row_len, rng)
    return w, x, native.qdot_rows(t, w, n_rows, row_len, x, impl=impl).astype(np.float64)


def assert_within_bounds(t: GGMLType, impl: str, y: np.ndarray, x: np.ndarray, wd: np.ndarray,
                         mag: np.ndarray) -> None:
    """y [T, N] from x [T, K] and weights dequantized to wd [N, K] (element magnitudes `mag`, the
    bound's scale): |y - W @ A| within float rounding, with A the rounded activations, and
    |y - W @ x| within that plus the activation rounding (half a step of each block's d)."""
    row_len = x.shape[1]
    _, d, a = numpy_qact(t, x)
    n = (row_len if t in FLOAT_TYPES else row_len // block_size(t)[0]) + 16
    round_tol = n * U * (np.abs(a) @ mag.T) + n * 2.0 ** -140                        # [T, N]
    err = np.abs(y - a @ wd.T)
    assert (err <= round_tol).all(), f"{t.name} {impl}: |y - W@A| {err.max()} over the rounding bound"
    d_elem = np.repeat(d, row_len // d.shape[1], axis=1) if t not in FLOAT_TYPES else np.zeros_like(x, np.float64)
    act_tol = (d_elem * 0.5 * (1 + 2.0 ** -15)) @ np.abs(wd).T
    err = np.abs(y - x.astype(np.float64) @ wd.T)
    assert (err <= act_tol + round_tol).all(), f"{t.name} {impl}: |y - W@x| {err.max()} over the bound"


@AVX2
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_avx2_matches_scalar(t, case):
    n_rows, n_blocks, n_tok = case
    rng = np.random.default_rng(int(t) * 7 + n_rows + n_tok)
    row_len = row_len_of(t, n_blocks)
    w = make_weights(t, n_rows, row_len, rng)
    x = make_tokens(n_tok, row_len, rng)
    ys = native.qdot_rows(t, w, n_rows, row_len, x, impl="scalar")
    ya = native.qdot_rows(t, w, n_rows, row_len, x, impl="avx2")
    if not native.has_qdot_kernel(t, "avx2"):
        assert np.array_equal(ys.view(np.uint32), ya.view(np.uint32)), f"{t.name}: scalar fallback differs"
        return
    _, _, a = numpy_qact(t, x)
    n = (row_len if t in FLOAT_TYPES else row_len // block_size(t)[0]) + 16
    tol = 2 * (n * U * (np.abs(a) @ magnitude(t, w, n_rows, row_len).T) + n * 2.0 ** -140)
    err = np.abs(ya.astype(np.float64) - ys)
    assert (err <= tol).all(), f"{t.name}: avx2 differs from scalar by {err.max()} (bound {tol.max()})"


@AVX2
@pytest.mark.parametrize("n_tok", [4, 5, 7, 8, 13])
def test_avx2_q4_0_prefill_rows_are_each_tokens_decode_bytes(n_tok):
    """Q4_0's prefill tile (8 rows by up to 4 tokens, codes unpacked once per block for all of them)
    gives each token the bytes of that token's decode product (8 rows, one token), so a token's
    logits do not depend on the batch it is computed in."""
    rng = np.random.default_rng(n_tok)
    n_rows, row_len = 24, 5 * 32
    w = make_weights(T.Q4_0, n_rows, row_len, rng)
    x = make_tokens(n_tok, row_len, rng)
    together = native.qdot_rows(T.Q4_0, w, n_rows, row_len, x, impl="avx2")
    for t in range(n_tok):
        alone = native.qdot_rows(T.Q4_0, w, n_rows, row_len, x[t:t + 1], impl="avx2")
        assert np.array_equal(together[t:t + 1].view(np.uint32), alone.view(np.uint32)), t


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
