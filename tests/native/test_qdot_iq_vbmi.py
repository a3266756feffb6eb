"""AVX-512 decode tiles of the grid i-quants by gathers (native/qdot_iq_vbmi.c) against their
scalar twins (native/qdot_iq.c).

These tiles compute each weight block's integer dot product exactly (each 64 values' grid rows in
one gather, signs from the ksigns fields with their parity made by GF2P8AFFINEQB or stored as bits)
and add the per-block float terms in another order than the scalar tile: the result is held within
the rounding bound of test_qdot_iq_grid_avx2.py. Decode calls (1-3 tokens) of an AVX-512 call reach
them through the kernel table where the CPU has VBMI, GFNI and fast gathers, except IQ2_XXS and IQ3_XXS,
whose planes tiles run instead (test_qdot_iq_planes.py runs this file under STRATA_PLANES=0 for them);
STRATA_VBMI=0 and STRATA_PLANES=0 give the AVX2 build back. Every grid row, every ksigns index and every sub-block scale is met (blocks made to
hold them all, not only random ones).
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
from strata.quant import GGMLType, block_size
from tests.native import test_matmul as tm
from tests.native.test_matmul import pools  # noqa: F401  (the fixture)
from tests.native.test_qdot import make_tokens
from tests.native.test_qdot_iq_grid_avx2 import _uniform_blocks, assert_close_to_scalar, check_shape
from tests.native.test_qdot_iquants import make_weights

T = GGMLType
ROOT = Path(__file__).resolve().parents[2]
#: The types with a VBMI decode tile (qdot.c's VBMI_DECODE).
VBMI_TYPES = (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M)
#: Where the kernel table hands them out (qdot.c's vbmi_decode).
VBMI_ENV = os.environ.get("STRATA_VBMI")
HAS_TILES = native.cpu_has_avx512_vbmi() and (native.cpu_fast_gathers() or VBMI_ENV == "1") and VBMI_ENV != "0"
pytestmark = pytest.mark.skipif(not HAS_TILES, reason="CPU has no AVX-512 VBMI and GFNI, or its gathers are slow "
                                                      "(STRATA_VBMI=1 runs them anyway), or STRATA_VBMI=0")
SHAPES = [(1, 1, 1), (7, 3, 1), (13, 2, 2), (5, 4, 3), (33, 1, 1), (3, 9, 2), (64, 2, 3)]
#: Where planes run (test_qdot_iq_planes.py's HAS_PLANES, which imports this file), IQ1 and IQ2_S are not
#: one tile: their decode calls go by rows (IQ2_S's where gathers are fast) and their 4-7 tokens by
#: planes, which that file holds to their own calls.
_PLANES_ENV = os.environ.get("STRATA_PLANES")
_PLANES_ON = native.cpu_has_avx512_vbmi() and (not native.cpu_splits_512() or _PLANES_ENV == "1") and _PLANES_ENV != "0"
SPLIT_BY_ROWS = ((T.IQ1_S, T.IQ1_M) if _PLANES_ON and (native.cpu_fast_gathers() or _PLANES_ENV == "1") else ()) + (
    (T.IQ2_S,) if _PLANES_ON and native.cpu_fast_gathers() else ())


def every_code_blocks(t: GGMLType, rng: np.random.Generator) -> np.ndarray:
    """Blocks that between them use every grid row, every 7-bit ksigns index (in every place it
    can take) and every ls, with random halves d and random bytes elsewhere (IQ3_S's signs)."""
    _, nbytes = block_size(t)
    n_blocks = 64 if t in (T.IQ1_S, T.IQ1_M) else 16   # 32 rows a block: 2048 for IQ1's grid
    blocks = rng.integers(0, 256, (n_blocks, nbytes), dtype=np.uint8)
    blocks[:, 0:2] = np.frombuffer(np.float16(rng.uniform(0.5, 2.0, n_blocks)).tobytes(), np.uint8).reshape(-1, 2)
    rows = np.arange(n_blocks * 64)   # grid rows in order: every one of 256, 512, 1024 or 2048
    signs = (np.arange(n_blocks * 32) * 37 % 128).astype(np.uint32)   # 37 odd: all 128 in every place
    n_aux = n_blocks * 8   # IQ2_XXS, IQ3_XXS: a u32 aux per 32 values: 4 ksigns, ls
    f = signs.reshape(n_aux, 4)
    ls = (np.arange(n_aux) % 16).astype(np.uint32)
    aux = (f[:, 0] | f[:, 1] << 7 | f[:, 2] << 14 | f[:, 3] << 21 | ls << 28).astype("<u4").view(np.uint8)
    if t == T.IQ2_XXS:   # 8 x (4 grid indices, u32 aux)
        qs = np.empty((n_blocks, 8, 8), np.uint8)
        qs[:, :, :4] = (rows[:n_blocks * 32] % 256).astype(np.uint8).reshape(n_blocks, 8, 4)
        qs[:, :, 4:] = aux.reshape(n_blocks, 8, 4)
        blocks[:, 2:66] = qs.reshape(n_blocks, 64)
    elif t == T.IQ2_XS:   # u16 per 8 values: 9-bit index, ksigns; a nibble ls per 16 values
        q = (rows[:n_blocks * 32] % 512 | signs << 9).astype("<u2")
        blocks[:, 2:66] = q.view(np.uint8).reshape(n_blocks, 64)
        nib = np.arange(n_blocks * 16) % 16
        blocks[:, 66:74] = (nib[0::2] | nib[1::2] << 4).astype(np.uint8).reshape(n_blocks, 8)
    elif t == T.IQ2_S:   # 32 low index bytes, 32 sign bytes, 2 high bits per row in qh, a nibble ls per 16
        idx = rows[:n_blocks * 32] % 1024
        blocks[:, 2:34] = (idx % 256).astype(np.uint8).reshape(n_blocks, 32)
        hi = (idx >> 8).reshape(n_blocks, 8, 4)
        blocks[:, 66:74] = (hi[:, :, 0] | hi[:, :, 1] << 2 | hi[:, :, 2] << 4 | hi[:, :, 3] << 6).astype(np.uint8)
        nib = np.arange(n_blocks * 16) % 16
        blocks[:, 74:82] = (nib[0::2] | nib[1::2] << 4).astype(np.uint8).reshape(n_blocks, 8)
    elif t == T.IQ3_XXS:   # 64 grid indices, then the aux words
        blocks[:, 2:66] = (rows % 256).astype(np.uint8).reshape(n_blocks, 64)
        blocks[:, 66:98] = aux.reshape(n_blocks, 32)
    elif t == T.IQ3_S:   # 64 low bytes, 64 ninth bits in qh, 32 sign bytes, a nibble ls per 32 values
        idx = rows % 512
        blocks[:, 2:66] = (idx % 256).astype(np.uint8).reshape(n_blocks, 64)
        blocks[:, 66:74] = np.packbits((idx >> 8).astype(np.uint8).reshape(n_blocks, 8, 8), axis=2,
                                       bitorder="little").reshape(n_blocks, 8)
        nib = np.arange(n_blocks * 8) % 16
        blocks[:, 106:110] = (nib[0::2] | nib[1::2] << 4).astype(np.uint8).reshape(n_blocks, 4)
    elif t == T.IQ1_S:   # 32 low index bytes, then per 32 values a u16: 3 high bits per row, ls, delta sign
        idx = rows[:n_blocks * 32] % 2048
        blocks[:, 2:34] = (idx % 256).astype(np.uint8).reshape(n_blocks, 32)
        hi = (idx >> 8).reshape(n_aux, 4)
        qh = hi[:, 0] | hi[:, 1] << 3 | hi[:, 2] << 6 | hi[:, 3] << 9 | (np.arange(n_aux) % 8) << 12 | (np.arange(n_aux) // 8 % 2) << 15
        blocks[:, 34:50] = qh.astype("<u2").view(np.uint8).reshape(n_blocks, 16)
    elif t == T.IQ1_M:   # 32 low index bytes, a nibble per row (3 high bits, delta sign), 3-bit scales per 16
        idx = rows[:n_blocks * 32] % 2048
        blocks[:, 0:32] = (idx % 256).astype(np.uint8).reshape(n_blocks, 32)
        nib = ((idx >> 8) | (np.arange(n_blocks * 32) // 3 % 2) << 3).reshape(n_blocks, 16, 2)
        blocks[:, 32:48] = (nib[:, :, 0] | nib[:, :, 1] << 4).astype(np.uint8)
        sub = (np.arange(n_blocks * 16) % 8).reshape(n_blocks, 4, 4)
        sc = (sub[:, :, 0] | sub[:, :, 1] << 3 | sub[:, :, 2] << 6 | sub[:, :, 3] << 9).astype(np.uint16)
        half = np.frombuffer(np.float16(rng.uniform(0.5, 2.0, n_blocks)).tobytes(), "<u2").astype(np.uint16)
        for m in range(4):   # d's nibbles in the words' top nibbles (strata_iq1_m_half)
            sc[:, m] |= ((half >> (4 * m)) & 15) << 12
        blocks[:, 48:56] = sc.astype("<u2").view(np.uint8).reshape(n_blocks, 8)
    else:
        raise AssertionError(t)
    return blocks


def test_decode_runs_the_vbmi_tiles():
    for t in VBMI_TYPES:
        assert kernel_family(t, "avx512", decode=True) == "avx512", t.name


def test_strata_vbmi_0_gives_the_avx2_build_back():
    code = ("from strata.native.qdot import kernel_family\nfrom strata.quant import GGMLType as T\n"
            f"print(' '.join(kernel_family(T[n], 'avx512', decode=True) for n in {[t.name for t in VBMI_TYPES]!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "STRATA_VBMI": "0", "STRATA_PLANES": "0"}, check=True).stdout.split()
    assert out == ["avx2"] * len(VBMI_TYPES)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"N{s[0]}-B{s[1]}-T{s[2]}")
@pytest.mark.parametrize("t", VBMI_TYPES, ids=lambda t: t.name)
def test_vbmi_matches_scalar(t, shape):
    check_shape(t, shape, "avx512")


@pytest.mark.parametrize("t", VBMI_TYPES, ids=lambda t: t.name)
def test_every_grid_row_sign_index_and_scale(t):
    rng = np.random.default_rng(int(t) + 5)
    blocks = every_code_blocks(t, rng)
    n_blocks = len(blocks)
    w = blocks.reshape(4, -1)   # 4 rows
    row_len = n_blocks // 4 * 256
    for n_tok in (1, 2, 3):
        assert_close_to_scalar(t, w, 4, make_tokens(n_tok, row_len, rng), f"{n_tok} tokens", impl="avx512")
    # one block at a time too: each block's sum alone, so no error hides behind another block's
    assert_close_to_scalar(t, blocks, n_blocks, make_tokens(1, 256, rng), "single blocks", impl="avx512")


def check_extreme_codes(t: GGMLType, n_blocks: int) -> None:
    """A row of all-ones bytes and a row of zero bytes (largest and smallest codes, every sign) against
    1-3 tokens of large activations of one sign and of both."""
    row_len = n_blocks * 256
    w = np.concatenate([_uniform_blocks(t, n_blocks, 0xFF), _uniform_blocks(t, n_blocks, 0x00)]).reshape(2, -1)
    x = np.stack([np.full(row_len, 1.0, np.float32), np.full(row_len, -2.0, np.float32),
                  np.where(np.arange(row_len) % 3, 1.0, -1.0).astype(np.float32)])
    for n_tok in (1, 2, 3):
        assert_close_to_scalar(t, w, 2, x[:n_tok], f"extreme codes, {n_tok} tokens", impl="avx512")


@pytest.mark.parametrize("t", VBMI_TYPES, ids=lambda t: t.name)
def test_largest_codes_and_activations_do_not_saturate(t):
    check_extreme_codes(t, 2)


@pytest.mark.parametrize("t", VBMI_TYPES, ids=lambda t: t.name)
def test_pooled_matmul_equals_the_single_threaded_tiles(pools, t):  # noqa: F811
    row_len = 3 * 256
    for n_tokens in (1, 2, 3):
        for n_rows in (1, 17, 601):
            w = make_weights(t, n_rows, row_len, np.random.default_rng(n_rows))
            x = tm.activations(n_tokens, row_len, seed=n_tokens)
            want = native.qdot_rows(t, w, n_rows, row_len, x, impl="avx512")
            for n in (None, 1, 2, 3):
                got = tm.matmul(pools[n], t, w.reshape(-1), n_rows, x, impl="avx512")
                assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), (t.name, n_rows, n_tokens, n)


@pytest.mark.parametrize("t", VBMI_TYPES, ids=lambda t: t.name)
def test_few_tokens_and_prefill_leftovers_run_the_gather_tiles(t):
    """Calls of 4-7 tokens, and the tokens a prefill's VNNI groups leave over (fewer than 8), run
    the gather tile too (one pass over the weights): each token's outputs equal a decode call's
    for it bit for bit (the AVX2 build's lanes would add in another order)."""
    if t in SPLIT_BY_ROWS:
        pytest.skip(f"{t.name}: decode calls by rows, 4-7 tokens by planes (test_qdot_iq_planes.py; "
                    "this file's gather tiles run under STRATA_PLANES=0 there)")
    rng = np.random.default_rng(int(t) + 11)
    n_rows, row_len = 9, 3 * 256
    w = make_weights(t, n_rows, row_len, rng)
    x = make_tokens(16 + 3, row_len, rng)
    one = np.concatenate([native.qdot_rows(t, w, n_rows, row_len, x[i:i + 1], impl="avx512") for i in range(19)])
    for n_tok in (4, 5, 7):
        got = native.qdot_rows(t, w, n_rows, row_len, x[:n_tok], impl="avx512")
        assert got.view(np.uint32).tobytes() == one[:n_tok].view(np.uint32).tobytes(), (t.name, n_tok)
    got = native.qdot_rows(t, w, n_rows, row_len, x, impl="avx512")   # 16 by VNNI, 3 left over
    assert got[16:].view(np.uint32).tobytes() == one[16:].view(np.uint32).tobytes(), t.name
