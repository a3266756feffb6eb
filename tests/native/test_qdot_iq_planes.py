"""The AVX-512 decode tiles by planes (native/qdot_iq_planes.c: IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S,
IQ1_M, IQ3_XXS, IQ3_S) against their scalar twins (native/qdot_iq.c).

The tiles look the grid up in registers one value position at a time (the IQ2s: 2-bit codes, turned
into the values 8, 25, 43 by GF2P8AFFINEQB; IQ3_XXS: 3-bit codes, by VPSHUFB; IQ1_S and IQ1_M
gather their codes, where gathers are fast) against activations re-laid once per thread and set of activations;
their integer sums are the scalar tiles', and the float terms are added in another order, so
results are held within the rounding bound of test_qdot_iq_grid_avx2.py. Decode calls (1-3 tokens)
of an AVX-512 call, and the 4-7 tokens that a prefill's VNNI groups leave over, reach them through
the kernel table where the CPU has VBMI and GFNI and does not split 512-bit operations
(STRATA_PLANES=1: there too; STRATA_PLANES=0: never). IQ1_S's, IQ1_M's and (where gathers are fast)
IQ2_S's decode calls go to the same file's tile by rows (rows_row: grid rows gathered as bytes),
their 4-7 tokens to the planes tile: both are held to the scalar twin here.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from strata import native
from strata.native.qdot import kernel_family
from strata.quant import GGMLType
from tests.native.test_matmul import pools  # noqa: F401  (the fixture)
from tests.native.test_qdot import make_tokens
from tests.native.test_qdot_avx512 import child_env
from tests.native.test_qdot_iq_grid_avx2 import assert_close_to_scalar, check_shape
from tests.native.test_qdot_iq_vbmi import check_extreme_codes, every_code_blocks
from tests.native.test_qdot_iquants import make_weights

T = GGMLType
ROOT = Path(__file__).resolve().parents[2]
#: Where the kernel table hands the tiles out (qdot.c's planes_decode).
PLANES_ENV = os.environ.get("STRATA_PLANES")
#: The types with a planes decode tile here (qdot.c's PLANES_DECODE; IQ1's gather: fast gathers only).
PLANES_TYPES = (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S) + (
    (T.IQ1_S, T.IQ1_M) if native.cpu_fast_gathers() or PLANES_ENV == "1" else ())
HAS_PLANES = (native.cpu_has_avx512_vbmi() and (not native.cpu_splits_512() or PLANES_ENV == "1")
              and PLANES_ENV != "0" and not os.environ.get("STRATA_FORCE_AVX2") and not os.environ.get("STRATA_FORCE_SCALAR"))
pytestmark = pytest.mark.skipif(not HAS_PLANES, reason="CPU has no AVX-512 VBMI and GFNI, or splits 512-bit operations "
                                                        "(STRATA_PLANES=1 runs the tile anyway), or STRATA_PLANES=0")
#: (rows, blocks per row, tokens): odd block counts leave a block without a pair
SHAPES = [(1, 1, 1), (7, 3, 1), (13, 2, 2), (5, 4, 3), (33, 1, 1), (3, 9, 2), (64, 2, 3), (17, 5, 1), (2, 28, 1)]
#: The types whose decode calls (1-3 tokens) take the tile by rows and their 4-7 tokens planes (IQ2_S:
#: where gathers are fast; IQ1 is here only there, or under STRATA_PLANES=1)
BY_ROWS = tuple(t for t in PLANES_TYPES if t in (T.IQ1_S, T.IQ1_M) or (t == T.IQ2_S and native.cpu_fast_gathers()))
#: calls of 4-7 tokens (a prefill's leftovers), which their planes tiles take
LEFTOVER_SHAPES = [(7, 3, 4), (5, 4, 5), (3, 9, 7), (9, 1, 6)]


def table_says(env: dict[str, str]) -> list[str]:
    code = ("from strata.native.qdot import kernel_family\nfrom strata.quant import GGMLType as T\n"
            f"print(' '.join(kernel_family(T[n], 'avx512', decode=True) for n in {[t.name for t in PLANES_TYPES]!r}))")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=child_env(**env), check=True).stdout.split()


def test_the_table_hands_the_tiles_out_for_decode():
    assert [kernel_family(t, "avx512", decode=True) for t in PLANES_TYPES] == ["avx512"] * len(PLANES_TYPES)
    # STRATA_PLANES=0 (with the gather tiles off too) gives the AVX2 build back
    assert table_says({"STRATA_PLANES": "0", "STRATA_VBMI": "0"}) == ["avx2"] * len(PLANES_TYPES)


by_type = pytest.mark.parametrize("t", PLANES_TYPES, ids=lambda t: t.name)


@by_type
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"N{s[0]}-B{s[1]}-T{s[2]}")
def test_planes_match_scalar(t, shape):
    check_shape(t, shape, "avx512")


@pytest.mark.parametrize("t", BY_ROWS, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", LEFTOVER_SHAPES, ids=lambda s: f"N{s[0]}-B{s[1]}-T{s[2]}")
def test_leftover_tokens_by_planes_match_scalar(t, shape):
    check_shape(t, shape, "avx512")


@by_type
def test_every_grid_row_sign_index_and_scale(t):
    rng = np.random.default_rng(41)
    blocks = every_code_blocks(t, rng)
    n_blocks = len(blocks)
    for n_rows in (4, 2):   # 4 blocks a row, then 8: pairs meet other pairs of indices
        row_len = n_blocks // n_rows * 256
        for n_tok in (1, 2, 3, 5) if t in BY_ROWS else (1, 2, 3):   # decode by rows, 5 tokens by planes
            assert_close_to_scalar(t, blocks.reshape(n_rows, -1), n_rows, make_tokens(n_tok, row_len, rng),
                                   f"{n_rows} rows, {n_tok} tokens", impl="avx512")
    # one block a row: every block alone (IQ2_XXS: the lone block of a pair), so no error hides behind another
    assert_close_to_scalar(t, blocks, n_blocks, make_tokens(1, 256, rng), "single blocks", impl="avx512")


@by_type
def test_largest_codes_and_activations_do_not_saturate(t):
    check_extreme_codes(t, 3)   # 3 blocks: a lone block in the last pair


@by_type
def test_each_token_alike_in_every_call_and_in_a_prefills_leftovers(t):
    """Calls of 1-7 tokens and the 3 tokens a 19-token prefill's VNNI group leaves over: each token's
    outputs equal a one-token call's bit for bit (the tile sums every token alike). Where decode calls
    go by rows (BY_ROWS), calls of 4-7 tokens take the planes tile: their tokens equal a 4-token call's."""
    rng = np.random.default_rng(7)
    n_rows, row_len = 9, 3 * 256
    w = make_weights(t, n_rows, row_len, rng)
    x = make_tokens(19, row_len, rng)
    one = np.concatenate([native.qdot_rows(t, w, n_rows, row_len, x[i:i + 1], impl="avx512") for i in range(19)])
    four = native.qdot_rows(t, w, n_rows, row_len, x[:4], impl="avx512")
    for n_tok in range(2, 8):
        got = native.qdot_rows(t, w, n_rows, row_len, x[:n_tok], impl="avx512")
        want = four[:n_tok] if t in BY_ROWS and n_tok >= 4 else one[:n_tok]
        assert got[:4].view(np.uint32).tobytes() == want[:4].view(np.uint32).tobytes(), n_tok
        if t not in BY_ROWS:
            assert got.view(np.uint32).tobytes() == one[:n_tok].view(np.uint32).tobytes(), n_tok
    got = native.qdot_rows(t, w, n_rows, row_len, x, impl="avx512")
    assert got[16:].view(np.uint32).tobytes() == one[16:].view(np.uint32).tobytes()


@by_type
def test_new_activations_in_the_same_buffer_are_re_laid(pools, t):  # noqa: F811
    """The layout is kept per thread while the activations stay the same: a second matmul into the
    same scratch with other tokens must see them (every write of activations bumps a serial)."""
    rng = np.random.default_rng(3)
    n_rows, row_len = 70, 4 * 256   # 5 row blocks: the layout serves each thread's later blocks
    w = make_weights(t, n_rows, row_len, rng)
    scratch = np.empty(native.matmul_scratch_bytes(t, 2, row_len), dtype=np.uint8)
    for n_threads in (1, 2):
        for seed in (1, 2, 3):
            x = make_tokens(2, row_len, np.random.default_rng(seed))
            y = np.full((2, n_rows), np.nan, dtype=np.float32)
            got = native.matmul_into(pools[n_threads], t, w, n_rows, row_len, x, y, scratch, impl="avx512")
            want = native.qdot_rows(t, w, n_rows, row_len, x, impl="avx512")
            assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), (n_threads, seed)


@pytest.mark.skipif(not native.cpu_fast_gathers(), reason="the gather tiles do not run on this CPU")
def test_the_gather_tiles_they_replace_still_match_their_scalar_twins():
    """Under STRATA_PLANES=0 these types decode with their gather tiles again: that file's cases of them."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
                           " or ".join(t.name for t in PLANES_TYPES),
                           "tests/native/test_qdot_iq_vbmi.py"], cwd=ROOT, env=child_env(STRATA_PLANES="0"),
                          capture_output=True, text=True, timeout=600)
    tail = done.stdout[-2000:]
    assert done.returncode == 0 and " passed" in tail and "skipped" not in tail, tail + done.stderr[-2000:]
