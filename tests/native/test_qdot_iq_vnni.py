"""AVX-512 VNNI prefill tiles of the grid i-quants, IQ4_XS, Q2_K and Q3_K (native/qdot_iq_vnni.c)
against their scalar twins.

Tokens in groups of 16 (and a last group of 8-15, padded; 12-15 for Q2_K and Q3_K) go through
VNNI, whose block sums are
the scalar ones and whose float steps are the scalar tile's in the same order: those outputs equal
the scalar kernels bit for bit. Fewer than 8 tokens left over run the AVX2 tiles' AVX-512 build,
held within twice the rounding bound (test_qdot_iq_grid_avx2.py's). The activations are re-laid once
per call and thread and kept until the next call: the pooled product with several threads and
row blocks, and two products in a row from the same activation buffer with new contents, must
equal single-threaded scalar calls. Decode (1-3 tokens) stays on the AVX2 build.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from strata import native
from strata.native.qdot import kernel_family
from strata.quant import GGMLType
from tests.native.test_qdot import make_tokens
from tests.native.test_qdot_avx512 import child_env
from tests.native.test_qdot_iq_grid_avx2 import GRID_TYPES, assert_close_to_scalar
from strata.quant import HALF_SCALE_OFFSETS, random_blocks
from tests.native.test_qdot import EXTREME_HALVES
from tests.native.test_qdot_iquants import SCALES, make_weights as make_iq_weights
from tests.native.test_qdot_iq_vbmi import HAS_TILES, VBMI_TYPES

T = GGMLType
K_TYPES = (T.Q2_K, T.Q3_K)
VNNI_TYPES = (*GRID_TYPES, T.IQ4_XS, *K_TYPES)


def make_weights(t, n_rows: int, row_len: int, rng: np.random.Generator) -> np.ndarray:
    """[n_rows, row bytes] of valid random blocks (the i-quants' maker; Q2_K and Q3_K: ~30% of the
    blocks with an extreme d or dmin)."""
    if t in SCALES:
        return make_iq_weights(t, n_rows, row_len, rng)
    n_blocks = n_rows * row_len // 256
    blocks = np.frombuffer(random_blocks(t, n_blocks, rng, 0.001), np.uint8).reshape(n_blocks, -1).copy()
    picked = np.flatnonzero(rng.random(n_blocks) < 0.3)
    for off in HALF_SCALE_OFFSETS[t]:
        blocks[picked, off:off + 2] = rng.choice(EXTREME_HALVES, len(picked)).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(n_rows, -1)


def vnni_tokens(t, n_tok: int) -> int:
    """How many of n_tok tokens the VNNI tile takes (qdot_iq_vnni.c's pad_min), the rest left to
    the AVX2 build."""
    pad_min = 12 if t in K_TYPES else 9 if native.cpu_splits_512() else 8  # Zen 4: 8 to the AVX2 build
    return n_tok if n_tok % 16 >= pad_min else n_tok - n_tok % 16
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not native.cpu_has_avx512(), reason="CPU has no AVX-512 (F/BW/VL/VNNI)")
# (rows, blocks per row, tokens): every token count here goes through VNNI whole (but 8 on Zen 4)
ALL_VNNI = [(1, 1, 8), (2, 1, 9), (5, 2, 16), (7, 3, 12), (9, 1, 32), (3, 2, 47), (6, 4, 40), (17, 1, 64)]
# and here some tokens are left to the AVX2 build (remainders 1-7)
MIXED = [(5, 2, 17), (4, 1, 23), (3, 3, 39), (6, 2, 4), (2, 1, 7)]


def bits(y) -> np.ndarray:
    return np.asarray(y, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("shape", ALL_VNNI, ids=lambda s: f"N{s[0]}-B{s[1]}-T{s[2]}")
@pytest.mark.parametrize("t", VNNI_TYPES, ids=lambda t: t.name)
def test_vnni_tiles_equal_scalar_bit_for_bit(t, shape):
    n_rows, n_blocks, n_tok = shape
    rng = np.random.default_rng(int(t) * 31 + n_rows + n_tok)
    w = make_weights(t, n_rows, n_blocks * 256, rng)
    x = make_tokens(n_tok, n_blocks * 256, rng)
    ys = native.qdot_rows(t, w, n_rows, n_blocks * 256, x, impl="scalar")
    yv = native.qdot_rows(t, w, n_rows, n_blocks * 256, x, impl="avx512")
    vnni = vnni_tokens(t, n_tok)  # all of them, but for Q2_K/Q3_K's 8-11 left over
    assert np.array_equal(bits(ys[:vnni]), bits(yv[:vnni])), f"{t.name} {shape}: {np.abs(ys - yv).max()}"
    assert_close_to_scalar(t, w, n_rows, x, f"shape {shape}", impl="avx512")


@pytest.mark.parametrize("shape", MIXED, ids=lambda s: f"N{s[0]}-B{s[1]}-T{s[2]}")
@pytest.mark.parametrize("t", VNNI_TYPES, ids=lambda t: t.name)
def test_leftover_tokens_within_the_bound(t, shape):
    n_rows, n_blocks, n_tok = shape
    rng = np.random.default_rng(int(t) * 37 + n_rows + n_tok)
    w = make_weights(t, n_rows, n_blocks * 256, rng)
    x = make_tokens(n_tok, n_blocks * 256, rng)
    assert_close_to_scalar(t, w, n_rows, x, f"shape {shape}", impl="avx512")
    yv = native.qdot_rows(t, w, n_rows, n_blocks * 256, x, impl="avx512")
    ys = native.qdot_rows(t, w, n_rows, n_blocks * 256, x, impl="scalar")
    vnni = vnni_tokens(t, n_tok)
    assert np.array_equal(bits(ys[:vnni]), bits(yv[:vnni])), t.name  # the VNNI tokens still exact


@pytest.mark.parametrize("t", VNNI_TYPES, ids=lambda t: t.name)
def test_pooled_and_repeated_products_reuse_no_stale_layout(t):
    """Several threads, many 16-row blocks, two calls from the same buffers with new contents."""
    rng = np.random.default_rng(int(t))
    n_rows, k, n_tok = 70, 512, 28  # all through VNNI, a last group of 12 padded
    w = torch.from_numpy(make_weights(t, n_rows, k, rng))
    x = torch.empty(n_tok, k)
    out = torch.empty(n_tok, n_rows)
    scratch = torch.empty(native.matmul_scratch_bytes(t, n_tok, k), dtype=torch.uint8)
    for threads in (1, 3):
        with native.ComputePool(threads) as pool:
            for _ in range(2):  # the same x, out and scratch buffers, new values each time
                x.copy_(torch.from_numpy(make_tokens(n_tok, k, rng)))
                native.matmul_into(pool, t, w, n_rows, k, x, out, scratch, impl="avx512")
                ref = native.qdot_rows(t, w.numpy(), n_rows, k, x.numpy(), impl="scalar")
                assert np.array_equal(bits(out.numpy()), bits(ref)), (t.name, threads)


@pytest.mark.parametrize("t", [t for t in VNNI_TYPES if t not in K_TYPES], ids=lambda t: t.name)
def test_who_takes_a_last_group_of_8_and_9_tokens(t):
    """8 tokens: the VNNI tile padded to 16, bit for bit the scalar tile's result; where 512-bit
    operations are split (Zen 4) the AVX2 build's one-pass 8-token tile instead, bit for bit its
    result (measured faster there, qdot_iq_vnni.c's pad_min). 9 tokens: VNNI everywhere."""
    rng = np.random.default_rng(int(t) + 77)
    n_rows, k = 6, 512
    w = make_weights(t, n_rows, k, rng)
    for n_tok in (8, 9):
        x = make_tokens(n_tok, k, rng)
        yv = native.qdot_rows(t, w, n_rows, k, x, impl="avx512")
        ys = native.qdot_rows(t, w, n_rows, k, x, impl="scalar")
        y2 = native.qdot_rows(t, w, n_rows, k, x, impl="avx2")
        assert not np.array_equal(bits(ys), bits(y2)), "the two references must differ for this test to tell"
        left_over = vnni_tokens(t, n_tok) < n_tok  # 8 on Zen 4
        if left_over and HAS_TILES:  # STRATA_VBMI=1 on Zen 4: the gather tiles take them (not checked here)
            continue
        want = y2 if left_over else ys
        assert np.array_equal(bits(yv), bits(want)), (t.name, n_tok, "AVX2 build" if left_over else "VNNI")


@pytest.mark.parametrize("t", VNNI_TYPES, ids=lambda t: t.name)
def test_prefill_runs_vnni_and_decode_the_table_s_tiles(t):
    # where 512-bit operations are split in two (Zen 4) too: measured 1.7-3.5x the AVX2 build there (qdot.c)
    assert kernel_family(t, "avx512", decode=False) == "avx512"
    # decode: the AVX2 build, or the VBMI decode tile of the types that have one (test_qdot_iq_vbmi.py),
    # or the zmm decode tiles of Q2_K, Q3_K and IQ4_XS where 512-bit operations are whole
    # (test_qdot_zmm_decode.py)
    own = (HAS_TILES and t in VBMI_TYPES) or (t in (*K_TYPES, T.IQ4_XS) and not native.cpu_splits_512())
    assert kernel_family(t, "avx512", decode=True) == ("avx512" if own else "avx2")


SUBPROCESS_CHECK = """
import numpy as np
from strata import native
from strata.quant import GGMLType as T
from tests.native.test_qdot import make_tokens
from tests.native.test_qdot_iq_vnni import make_weights
rng = np.random.default_rng(3)
for t in (T.IQ2_XXS, T.IQ3_XXS, T.IQ2_XS, T.IQ3_S, T.IQ2_S, T.IQ1_S, T.IQ1_M, T.IQ4_XS, T.Q2_K, T.Q3_K):
    assert native.type_support(t).runs == "avx512", t.name
    for n_rows, n_blocks, n_tok in ((5, 2, 16), (3, 1, 28)):
        w, x = make_weights(t, n_rows, 256 * n_blocks, rng), make_tokens(n_tok, 256 * n_blocks, rng)
        ys = native.qdot_rows(t, w, n_rows, 256 * n_blocks, x, impl="scalar")
        yv = native.qdot_rows(t, w, n_rows, 256 * n_blocks, x, impl="avx512")
        assert np.array_equal(ys.view(np.uint32), yv.view(np.uint32)), (t.name, n_tok)
print("ok")
"""


def test_vnni_tiles_under_own_tiles_on_any_avx512_machine():
    """STRATA_AVX512_OWN_TILES=1 hands out the VNNI tiles for prefill everywhere (Zen 4 too)."""
    env = child_env(STRATA_AVX512_OWN_TILES="1")
    done = subprocess.run([sys.executable, "-c", SUBPROCESS_CHECK], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["ok"], done.stderr[-2000:]

