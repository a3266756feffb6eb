"""AVX2 tile kernels of IQ4_NL, IQ4_XS, TQ2_0, TQ1_0 and NVFP4 (native/qdot_iq4_avx2.c) against
their scalar twins (native/qdot_iq.c):

- with every float step exact (power-of-two scales, activation blocks with d = 1, small integer
  sums) the two give the same bits, equal to float64 W @ x: the integer block sums are exact;
- on random weights with extreme scales they agree within twice the float-rounding bound of
  test_qdot.py (both are within it of the exact W @ A; only the order of the float additions
  differs), for 1..33 tokens (decode tiles, prefill tiles of 8 and 4 and their leftovers), odd row
  counts and rows of several blocks;
- through the pooled `strata_matmul` (1-3 threads) the AVX2 product is bit for bit the
  single-threaded kernel's, at decode and prefill token counts.
"""
from __future__ import annotations

import gguf.quants
import numpy as np
import pytest

from strata import native
from strata.quant import HALF_SCALE_OFFSETS, GGMLType, block_size, random_blocks
from tests.native import test_matmul as tm
from tests.native.test_matmul import pools  # noqa: F401  (the fixture)
from tests.native.test_qdot import U, make_tokens, numpy_qact
from tests.native.test_qdot_iquants import IQ4_AVX2_TYPES as TYPES, SCALES, make_weights

T = GGMLType
pytestmark = pytest.mark.skipif(not native.cpu_has_avx2(), reason="CPU has no AVX2/FMA/F16C")

ROWS = (1, 3, 5, 7, 9, 13, 17, 33)   # odd counts: 4-row decode tiles and their leftovers
BLOCKS = (1, 2, 3, 5)                # weight blocks per row


def act_block(t: GGMLType) -> int:
    return 32 if t in (T.IQ4_NL, T.NVFP4) else 256


def row_len_of(t: GGMLType, n_blocks: int) -> int:
    return n_blocks * block_size(t)[0]


def exact_weights(t: GGMLType, n_rows: int, row_len: int, rng: np.random.Generator) -> np.ndarray:
    """Random codes with every scale 2^-3 (NVFP4: every UE4M3 scale 0x38, halved 2^-1)."""
    elems, nbytes = block_size(t)
    n_blocks = n_rows * row_len // elems
    blocks = random_blocks(t, n_blocks, rng).reshape(n_blocks, nbytes)
    if t == T.NVFP4:
        blocks[:, :4] = 0x38
    for off in HALF_SCALE_OFFSETS.get(t, ()):
        blocks[:, off:off + 2] = np.array([0x3000], dtype="<u2").view(np.uint8)  # 2^-3
    return blocks.reshape(n_rows, -1)


def exact_tokens(t: GGMLType, n_tok: int, row_len: int, rng: np.random.Generator) -> np.ndarray:
    """Integers in [-7, 7] with one +-127 per activation block: d = 1 and q = x exactly, and every
    partial sum of the products stays below 2^24."""
    x = rng.integers(-7, 8, (n_tok, row_len)).astype(np.float32)
    blk = act_block(t)
    x[:, rng.integers(0, blk)::blk] = rng.choice([-127.0, 127.0], (n_tok, row_len // blk))
    return x


def test_the_types_have_avx2_kernels():
    for t in TYPES:
        assert native.has_qdot_kernel(t, "avx2"), t.name
        # AVX-512 runs the AVX2 kernels, but for IQ4_NL's own 8-row VNNI tiles (test_qdot_avx512.py),
        # IQ4_XS's VNNI prefill tiles (test_qdot_iq_vnni.py) and TQ1_0's decode (test_qdot_tq1_avx512.py)
        assert native.has_qdot_kernel(t, "avx512") == (t in (T.IQ4_NL, T.IQ4_XS, T.TQ1_0)), t.name


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_avx2_equals_scalar_bit_for_bit_when_the_floats_are_exact(t):
    rng = np.random.default_rng(int(t))
    for n_tok in (1, 2, 3, 4, 8, 9, 13):
        n_rows, row_len = ROWS[n_tok % len(ROWS)], row_len_of(t, (1, 2)[n_tok % 2] if act_block(t) == 256 else 8)
        w, x = exact_weights(t, n_rows, row_len, rng), exact_tokens(t, n_tok, row_len, rng)
        want = x.astype(np.float64) @ gguf.quants.dequantize(w, t).reshape(n_rows, row_len).astype(np.float64).T
        ys = native.qdot_rows(t, w, n_rows, row_len, x, impl="scalar")
        ya = native.qdot_rows(t, w, n_rows, row_len, x, impl="avx2")
        assert np.array_equal(ys, want), (t.name, n_tok)
        assert np.array_equal(ya.view(np.uint32), ys.view(np.uint32)), (t.name, n_rows, n_tok)


def rounding_tol(t: GGMLType, w: np.ndarray, x: np.ndarray, n_rows: int, row_len: int) -> np.ndarray:
    """Twice test_qdot.py's float-rounding bound of |y - W @ A|: [T, N]."""
    wd = gguf.quants.dequantize(w, t).reshape(n_rows, row_len).astype(np.float64)
    _, _, a = numpy_qact(t, x)
    n = row_len // block_size(t)[0] + 16
    return 2 * (n * U * (np.abs(a) @ np.abs(wd).T) + n * 2.0 ** -140)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_avx2_matches_scalar_for_1_to_33_tokens(t):
    rng = np.random.default_rng(100 + int(t))
    for n_tok in range(1, 34):
        n_rows, n_blocks = ROWS[n_tok % len(ROWS)], BLOCKS[n_tok % len(BLOCKS)]
        row_len = row_len_of(t, n_blocks)
        w, x = make_weights(t, n_rows, row_len, rng), make_tokens(n_tok, row_len, rng)
        ys = native.qdot_rows(t, w, n_rows, row_len, x, impl="scalar")
        ya = native.qdot_rows(t, w, n_rows, row_len, x, impl="avx2")
        err = np.abs(ya.astype(np.float64) - ys)
        tol = rounding_tol(t, w, x, n_rows, row_len)
        assert (err <= tol).all(), f"{t.name} N{n_rows} B{n_blocks} T{n_tok}: {err.max()} (bound {tol.max()})"
        assert np.isfinite(ya).all()


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_every_row_and_token_count_of_a_tile(t):
    """Each output of every tile shape (8-, 4- and 1-row decode, 8- and 4-token prefill, leftovers)
    against the scalar kernel on the same weights: rows 1..13 by tokens 1..11."""
    rng = np.random.default_rng(200 + int(t))
    row_len = row_len_of(t, 2)
    w, x = make_weights(t, 13, row_len, rng), make_tokens(11, row_len, rng)
    for n_rows in range(1, 14):
        for n_tok in range(1, 12):
            wr, xr = w[:n_rows], x[:n_tok]
            ys = native.qdot_rows(t, wr, n_rows, row_len, xr, impl="scalar")
            ya = native.qdot_rows(t, wr, n_rows, row_len, xr, impl="avx2")
            tol = rounding_tol(t, wr, xr, n_rows, row_len)
            assert (np.abs(ya.astype(np.float64) - ys) <= tol).all(), (t.name, n_rows, n_tok)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_pooled_avx2_matmul_equals_the_kernel_for_every_thread_count(pools, t):  # noqa: F811
    row_len = row_len_of(t, 3)
    for n_tokens in (1, 2, 3, 8, 9, 33):
        # the last count splits into several 16-row blocks per thread (64 KiB of work or more)
        for n_rows in (1, 17, 97, -(-tm.SPLIT_WORK // (w_row_bytes(t, row_len) * n_tokens)) | 1):
            w = random_blocks(t, n_rows * row_len // block_size(t)[0], np.random.default_rng(n_rows), SCALES[t])
            x = tm.activations(n_tokens, row_len, seed=n_tokens)
            want = native.qdot_rows(t, w, n_rows, row_len, x, impl="avx2")
            for n in (None, 1, 2, 3):
                got = tm.matmul(pools[n], t, w, n_rows, x, impl="avx2")
                assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), (t.name, n_rows, n_tokens, n)
            ys = native.qdot_rows(t, w, n_rows, row_len, x, impl="scalar")
            tol = rounding_tol(t, w.reshape(n_rows, -1), x, n_rows, row_len)
            assert (np.abs(want.astype(np.float64) - ys) <= tol).all(), (t.name, n_rows, n_tokens)


def w_row_bytes(t: GGMLType, row_len: int) -> int:
    elems, nbytes = block_size(t)
    return row_len // elems * nbytes
