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


def own_tile_outputs(tmp_path, name: str, w: np.ndarray, x: np.ndarray, n_rows: int, row_len: int) -> np.ndarray:
    """[n_tok, n_rows]: for each count n of x's first tokens, the last token's row of the tile's
    product, run in a child under STRATA_AVX512_OWN_TILES=1 (the tile for every phase and count)."""
    np.save(tmp_path / f"{name}_w.npy", w)
    np.save(tmp_path / f"{name}_x.npy", x)
    code = ("import sys, numpy as np; from strata import native; from strata.quant import GGMLType; "
            "from strata.native.qdot import kernel_family; d, name = sys.argv[1:]; "
            "w, x = np.load(f'{d}/{name}_w.npy'), np.load(f'{d}/{name}_x.npy'); "
            "assert kernel_family(GGMLType.TQ1_0, 'avx512', False) == 'avx512'; "
            "assert kernel_family(GGMLType.TQ1_0, 'avx512', True) == 'avx512'; "
            f"np.save(f'{{d}}/{{name}}_y.npy', np.stack([native.qdot_rows(GGMLType.TQ1_0, w, {n_rows}, {row_len}, "
            "x[:n], impl='avx512')[-1] for n in range(1, len(x) + 1)]))")
    env = child_env(STRATA_AVX512_OWN_TILES="1")
    subprocess.run([sys.executable, "-c", code, str(tmp_path), name], env=env, check=True, capture_output=True,
                   text=True)
    return np.load(tmp_path / f"{name}_y.npy")


def test_every_token_count_through_own_tiles(tmp_path):
    """STRATA_AVX512_OWN_TILES=1: the tile takes 1..13 tokens (groups of 4 and what is left)."""
    rng = np.random.default_rng(7)
    n_rows, row_len = 21, 256 * 18
    w, x = make_weights(T, n_rows, row_len, rng), make_tokens(13, row_len, rng)
    got = own_tile_outputs(tmp_path, "random", w, x, n_rows, row_len)  # [13, rows]: each count's last token
    for n in range(1, 14):
        ys = native.qdot_rows(T, w, n_rows, row_len, x[:n], impl="scalar")
        tol = rounding_tol(T, w, x[:n], n_rows, row_len)
        assert (np.abs(got[n - 1].astype(np.float64) - ys[-1]) <= tol[-1]).all(), n


def test_own_tile_bit_for_bit_when_the_floats_are_exact(tmp_path):
    """The same tile on exact inputs, through STRATA_AVX512_OWN_TILES=1: where the table decodes with
    the AVX2 build (Zen 4) the in-process tests above do not reach it."""
    rng = np.random.default_rng(11)
    for n_rows, n_blocks in ((17, 2), (3, 17), (19, 32)):
        row_len = 256 * n_blocks
        w, x = exact_weights(T, n_rows, row_len, rng), exact_tokens(T, 5, row_len, rng)
        got = own_tile_outputs(tmp_path, f"exact{n_rows}", w, x, n_rows, row_len)
        for n in range(1, 6):
            ys = native.qdot_rows(T, w, n_rows, row_len, x[:n], impl="scalar")
            assert np.array_equal(got[n - 1].view(np.uint32), ys[-1].view(np.uint32)), (n_rows, n_blocks, n)
