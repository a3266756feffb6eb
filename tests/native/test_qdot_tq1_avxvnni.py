"""TQ1_0's decode tile for AVX2 CPUs with AVX-VNNI (native/qdot_tq1_avxvnni.c: at 1-2 tokens the
digit sums taken from the bytes' powers without digits, at 3 the digits made 32 at a time, VEX-encoded
VPDPBUSD on ymm) against the scalar twin: bit for bit when every float step is exact, within twice
the rounding bound on random weights, across the tile's seams (16-row passes, 16-block re-laid chunks,
two blocks' chains interleaved, one left over); a token's result is the same bits in calls of 1, 2 and 3 tokens.
The AVX2 family decodes TQ1_0 with it where the CPU has AVX-VNNI (Intel's Alder Lake and later
client cores, and this Xeon's kind); STRATA_AVX_VNNI=0 takes the AVX2 tile that makes the digits, which
a child process checks the same way. Skipped where the CPU has no AVX-VNNI."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from strata import native
from strata.quant import GGMLType
from tests.native.test_qdot import make_tokens
from tests.native.test_qdot_avx512 import ROOT, child_env
from tests.native.test_qdot_iq4_avx2 import exact_tokens, exact_weights, rounding_tol
from tests.native.test_qdot_iquants import make_weights
from tests.native.test_qdot_tq1_avx512 import check_token_bits

T = GGMLType.TQ1_0
pytestmark = pytest.mark.skipif(not (native.cpu_has_avx2() and native.cpu_avx_vnni()),
                                reason="CPU without AVX2 and AVX-VNNI (or STRATA_AVX_VNNI=0)")

# (rows, blocks per row): one block; odd rows below and above a 16-row pass; a row longer than a
# 16-block chunk (one chunk and a part), and exactly two chunks; odd block counts (a lone last block)
SHAPES = ((1, 1), (5, 3), (17, 2), (33, 5), (3, 17), (19, 32), (2, 37), (4, 6), (2, 23))


def check(n_tok: int, seed: int) -> None:
    """The AVX2 family's decode against the scalar twin on every shape: exact floats bit for bit,
    random weights within the bound."""
    rng = np.random.default_rng(seed)
    for n_rows, n_blocks in SHAPES:
        row_len = 256 * n_blocks
        w, x = exact_weights(T, n_rows, row_len, rng), exact_tokens(T, n_tok, row_len, rng)
        ys = native.qdot_rows(T, w, n_rows, row_len, x, impl="scalar")
        yv = native.qdot_rows(T, w, n_rows, row_len, x, impl="avx2")
        assert np.array_equal(yv.view(np.uint32), ys.view(np.uint32)), ("exact", n_rows, n_blocks, n_tok)
        w, x = make_weights(T, n_rows, row_len, rng), make_tokens(n_tok, row_len, rng)
        ys = native.qdot_rows(T, w, n_rows, row_len, x, impl="scalar")
        yv = native.qdot_rows(T, w, n_rows, row_len, x, impl="avx2")
        tol = rounding_tol(T, w, x, n_rows, row_len)
        assert np.isfinite(yv).all() and (np.abs(yv.astype(np.float64) - ys) <= tol).all(), (n_rows, n_blocks, n_tok)


@pytest.mark.parametrize("n_tok", (1, 2, 3))
def test_the_tile_matches_the_scalar_twin(n_tok):
    check(n_tok, 40 + n_tok)


def test_each_token_the_same_bits_in_calls_of_1_to_3_tokens():
    """1 and 2 tokens take the sums without digits, 3 make the digits: the same lanes, so the same bits."""
    check_token_bits("avx2", ((5, 3), (19, 32), (2, 37), (3, 1)), 6)


def test_without_avx_vnni_the_avx2_tile_decodes_and_matches_too():
    code = ("from strata import native\nfrom tests.native.test_qdot_tq1_avxvnni import check\n"
            "assert not native.cpu_avx_vnni()\nfor n in (1, 2, 3):\n    check(n, 50 + n)\nprint('ok')\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env(STRATA_AVX_VNNI="0"),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
