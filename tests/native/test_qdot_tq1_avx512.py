"""TQ1_0's own AVX-512 tile (native/qdot_iq4_avx2.c, EVEX build: at 1-2 tokens the digit sums
taken from the bytes' powers without digits, from 3 tokens the digits made 64 at a time, one VPDPBUSD
per power) against the scalar twin: decode on AVX-512 machines runs it, prefill the AVX2
tile's build (and decode too where 512-bit operations are split in two, Zen 4: measured slower
there, native/qdot.c); bit for bit when every float step is exact, within twice the rounding bound
on random weights, across the tile's seams (16-row passes, 16-block re-laid chunks, 4-token groups).
STRATA_AVX512_OWN_TILES hands the tile every token count on every AVX-512 machine: the subprocess
test checks it there, so the tile is tested on Zen 4 too. Skipped without AVX-512."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from strata import native
from strata.native.qdot import kernel_family
from strata.quant import GGMLType
from tests.native.test_qdot import make_tokens
from tests.native.test_qdot_avx512 import child_env
from tests.native.test_qdot_iq4_avx2 import exact_tokens, exact_weights, rounding_tol
from tests.native.test_qdot_iquants import make_weights

T = GGMLType.TQ1_0
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not native.cpu_has_avx512(), reason="CPU (or OS) without AVX-512 F/BW/VL/VNNI")

# (rows, blocks per row): one block; odd rows below and above a 16-row pass; a row longer than a
# 16-block chunk (one chunk and a part), and exactly two chunks; groups of 4 blocks (decode's sums)
# with 1, 2 and 3 left over
SHAPES = ((1, 1), (5, 3), (17, 2), (33, 5), (3, 17), (19, 32), (2, 37), (4, 6), (2, 23))


def test_decode_runs_the_avx512_tile_and_prefill_the_avx2_build():
    assert native.has_qdot_kernel(T, "avx512")
    assert kernel_family(T, "avx512", decode=True) == ("avx2" if native.cpu_splits_512() else "avx512")
    assert kernel_family(T, "avx512", decode=False) == "avx2"


@pytest.mark.parametrize("n_tok", (1, 2, 3))
def test_bit_for_bit_when_the_floats_are_exact(n_tok):
    rng = np.random.default_rng(n_tok)
    for n_rows, n_blocks in SHAPES:
        row_len = 256 * n_blocks
        w, x = exact_weights(T, n_rows, row_len, rng), exact_tokens(T, n_tok, row_len, rng)
        ys = native.qdot_rows(T, w, n_rows, row_len, x, impl="scalar")
        yv = native.qdot_rows(T, w, n_rows, row_len, x, impl="avx512")
        assert np.array_equal(yv.view(np.uint32), ys.view(np.uint32)), (n_rows, n_blocks, n_tok)


@pytest.mark.parametrize("n_tok", (1, 2, 3))
def test_within_the_rounding_bound_on_random_weights(n_tok):
    rng = np.random.default_rng(10 + n_tok)
    for n_rows, n_blocks in SHAPES:
        row_len = 256 * n_blocks
        w, x = make_weights(T, n_rows, row_len, rng), make_tokens(n_tok, row_len, rng)
        ys = native.qdot_rows(T, w, n_rows, row_len, x, impl="scalar")
        yv = native.qdot_rows(T, w, n_rows, row_len, x, impl="avx512")
        tol = rounding_tol(T, w, x, n_rows, row_len)
        assert np.isfinite(yv).all() and (np.abs(yv.astype(np.float64) - ys) <= tol).all(), (n_rows, n_blocks, n_tok)


def test_each_token_the_same_bits_in_calls_of_1_to_3_tokens():
    """Calls of 1 and 2 tokens take the digit sums without digits, 3 tokens make the digits: every
    token's row is the same bits in either, on random bytes (every digit of every byte value)."""
    check_token_bits("avx512", ((5, 3), (19, 32), (2, 37)), 5)


def check_token_bits(impl: str, shapes, seed: int) -> None:
    """Each token's row from `impl` is the same bits alone and in calls of 2 and 3 tokens, and within
    the rounding bound of the scalar twin (shapes: (rows, blocks per row))."""
    rng = np.random.default_rng(seed)
    for n_rows, n_blocks in shapes:
        row_len = 256 * n_blocks
        w = make_weights(T, n_rows, row_len, rng)
        x = make_tokens(3, row_len, rng)
        alone = [native.qdot_rows(T, w, n_rows, row_len, x[i:i + 1], impl=impl)[0] for i in range(3)]
        for n in (2, 3):
            y = native.qdot_rows(T, w, n_rows, row_len, x[:n], impl=impl)
            for i in range(n):
                assert np.array_equal(y[i].view(np.uint32), alone[i].view(np.uint32)), (n_rows, n_blocks, n, i)
        ys = native.qdot_rows(T, w, n_rows, row_len, x, impl="scalar")
        tol = rounding_tol(T, w, x, n_rows, row_len)
        assert (np.abs(np.stack(alone).astype(np.float64) - ys) <= tol).all(), (n_rows, n_blocks)
