"""What particular tiles promise beyond their scalar twin's bound (test_qdot_tiles.py holds every tile to
that): bits that do not depend on the batch a token is computed in, the VNNI prefill tiles' exact
sums, activations re-laid per thread that never go stale, the hand-over of the tokens a tile does not
take, the same bits from builds that differ only in instructions, and the stand-alone C check.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from strata import native
from strata.native.qdot import cpu, select
from strata.quant import GGMLType
from strata.quant_table import BY_NAME, TILE_KINDS, TYPES, kinds_of
from tests.native.qdot_cases import assert_close_to_scalar, bits, make_tokens, make_weights, qdot, random_weights

T = GGMLType
ROOT = Path(__file__).resolve().parents[2]
HERE = cpu().features
needs = {f: pytest.mark.skipif(f not in HERE, reason=f"CPU (or STRATA_KERNEL) without {f}")
         for f in ("avx2", "avx512", "vbmi_gfni", "avx_vnni")}
GRID_TYPES = (T.IQ2_XXS, T.IQ3_XXS, T.IQ2_XS, T.IQ3_S, T.IQ2_S, T.IQ1_S, T.IQ1_M)
K_VNNI = (T.Q2_K, T.Q3_K)
VNNI_TYPES = (*GRID_TYPES, T.IQ4_XS, *K_VNNI)   # their "avx512" tiles: qdot_iq_vnni.c
SPLITS = native.cpu_splits_512()


@needs["avx2"]
@pytest.mark.parametrize("n_tok", [4, 5, 7, 8, 13])
def test_avx2_q4_0_prefill_rows_are_each_tokens_decode_bytes(n_tok):
    """Q4_0's prefill tile (8 rows by up to 4 tokens, codes unpacked once per block for all of them)
    gives each token the bytes of that token's decode product (8 rows, one token), so a token's
    logits do not depend on the batch it is computed in."""
    rng = np.random.default_rng(n_tok)
    w, x = make_weights(T.Q4_0, 24, 5 * 32, rng), make_tokens(n_tok, 5 * 32, rng)
    together = qdot(T.Q4_0, w, x, "avx2")
    for t in range(n_tok):
        assert bits(together[t:t + 1]) == bits(qdot(T.Q4_0, w, x[t:t + 1], "avx2")), t


# ---- The VNNI prefill tiles (qdot_iq_vnni.c): tokens in groups of 16 (and a last group of 8-15,
# padded; 12-15 for Q2_K and Q3_K) with the scalar tile's block sums and float steps in its order:
# those outputs equal the scalar twin's bit for bit. Fewer tokens left over go to the decode tile
# the table picks (strata_qdot_few_tokens), held within the bound. ----

def vnni_tokens(t, n_tok: int) -> int:
    """How many of n_tok tokens the VNNI tile takes (qdot_iq_vnni.c's pad_min)."""
    pad_min = 12 if t in K_VNNI else 9 if SPLITS else 8   # Zen 4: a last group of 8 to the AVX2 build
    return n_tok if n_tok % 16 >= pad_min else n_tok - n_tok % 16


vnni = pytest.mark.parametrize("t", VNNI_TYPES, ids=lambda t: t.name)
# (rows, blocks per row, tokens): every count through VNNI whole (but 8 on Zen 4); then remainders 1-7
ALL_VNNI = [(1, 1, 8), (2, 1, 9), (5, 2, 16), (7, 3, 12), (9, 1, 32), (3, 2, 47), (6, 4, 40), (17, 1, 64),
            (5, 2, 16), (3, 1, 28)]
MIXED = [(5, 2, 17), (4, 1, 23), (3, 3, 39), (6, 2, 4), (2, 1, 7)]


@needs["avx512"]
@vnni
def test_vnni_tiles_equal_scalar_bit_for_bit(t):
    for n_rows, n_blocks, n_tok in ALL_VNNI + MIXED:
        rng = np.random.default_rng(int(t) * 31 + n_rows + n_tok)
        w, x = random_weights(t, n_rows, n_blocks * 256, rng), make_tokens(n_tok, n_blocks * 256, rng)
        yv = assert_close_to_scalar(t, w, x, "avx512", f"{(n_rows, n_blocks, n_tok)}")
        taken = vnni_tokens(t, n_tok)
        assert bits(qdot(t, w, x, "ref")[:taken]) == bits(yv[:taken]), (t.name, n_rows, n_blocks, n_tok)


@needs["avx512"]
@vnni
def test_pooled_and_repeated_vnni_products_reuse_no_stale_layout(t):
    """Several threads, many 16-row blocks, two calls from the same buffers with new contents."""
    rng = np.random.default_rng(int(t))
    n_rows, k, n_tok = 70, 512, 28   # all through VNNI, a last group of 12 padded
    w = torch.from_numpy(random_weights(t, n_rows, k, rng))
    x, out = torch.empty(n_tok, k), torch.empty(n_tok, n_rows)
    scratch = torch.empty(native.matmul_scratch_bytes(t, n_tok, k), dtype=torch.uint8)
    for threads in (1, 3):
        with native.ComputePool(threads) as pool:
            for _ in range(2):
                x.copy_(torch.from_numpy(make_tokens(n_tok, k, rng)))
                native.matmul_into(pool, t, w, n_rows, k, x, out, scratch, impl="avx512")
                assert bits(out.numpy()) == bits(qdot(t, w.numpy(), x.numpy(), "ref")), (t.name, threads)


@needs["avx512"]
@pytest.mark.parametrize("t", [t for t in VNNI_TYPES if t not in K_VNNI], ids=lambda t: t.name)
def test_who_takes_a_last_group_of_8_and_9_tokens(t):
    """8 tokens: the VNNI tile padded to 16, bit for bit the scalar tile's result; where 512-bit
    operations are split (Zen 4) the AVX2 build's one-pass 8-token tile instead, bit for bit its
    result (measured faster there, qdot_iq_vnni.c's pad_min). 9 tokens: VNNI everywhere."""
    rng = np.random.default_rng(int(t) + 77)
    w = random_weights(t, 6, 512, rng)
    for n_tok in (8, 9):
        x = make_tokens(n_tok, 512, rng)
        yv, ys, y2 = qdot(t, w, x, "avx512"), qdot(t, w, x, "ref"), qdot(t, w, x, "avx2")
        assert bits(ys) != bits(y2), "the two references must differ for this test to tell"
        left_over = vnni_tokens(t, n_tok) < n_tok   # 8 on Zen 4
        if left_over and select(t, "avx512", 1) != "evex":   # a decode tile of its own takes them
            continue
        assert bits(yv) == bits(y2 if left_over else ys), (t.name, n_tok, "AVX2 build" if left_over else "VNNI")


# ---- Decode tiles that sum every token alike: a token's bits do not depend on its call ----

def by_rows(t) -> bool:
    """The planes tile's decode calls go by rows (rows_row) for IQ1, and IQ2_S where gathers are fast."""
    return t in (T.IQ1_S, T.IQ1_M) or (t == T.IQ2_S and "fast_gathers" in HERE)


@needs["vbmi_gfni"]
@pytest.mark.parametrize("kind", ["planes", "vbmi"])
@pytest.mark.parametrize("t", GRID_TYPES, ids=lambda t: t.name)
def test_each_token_alike_in_every_call_and_in_a_prefills_leftovers(t, kind):
    """Calls of 1-7 tokens: each token's outputs equal a one-token call's bit for bit (the planes tile
    by rows: its 4-7 tokens a 4-token call's). And where the table decodes with the tile, the 3
    tokens a 19-token prefill's VNNI group leaves over go to it: a one-token call's bits."""
    rng = np.random.default_rng(7)
    w, x = make_weights(t, 9, 3 * 256, rng), make_tokens(19, 3 * 256, rng)
    one = np.concatenate([qdot(t, w, x[i:i + 1], kind) for i in range(19)])
    four = qdot(t, w, x[:4], kind)
    rows = kind == "planes" and by_rows(t)
    for n_tok in range(2, 8):
        got = qdot(t, w, x[:n_tok], kind)
        want = four[:n_tok] if rows and n_tok >= 4 else one[:n_tok]
        assert bits(got[:4]) == bits(want[:4]), (t.name, kind, n_tok)
        if not rows:
            assert bits(got) == bits(one[:n_tok]), (t.name, kind, n_tok)
    if select(t, "avx512", 1) == kind:
        got = native.qdot_rows(t, w, 9, 3 * 256, x, impl="avx512")   # 16 by VNNI, 3 left over
        assert bits(got[16:]) == bits(one[16:]), (t.name, kind)


@needs["avx2"]
@pytest.mark.parametrize("kind", ["avx512", "avxvnni"])
def test_tq1_0_each_token_the_same_bits_in_calls_of_1_to_3_tokens(kind):
    """TQ1_0's decode tiles take the digit sums without digits at 1-2 tokens and make the digits at 3:
    the same lanes, so each token's row is the same bits alone and in calls of 2 and 3 tokens."""
    if not set(TILE_KINDS[kind].needs) <= HERE:
        pytest.skip(f"CPU without {kind}")
    rng = np.random.default_rng(5)
    for n_rows, n_blocks in ((5, 3), (19, 32), (2, 37), (3, 1)):
        w, x = random_weights(T.TQ1_0, n_rows, 256 * n_blocks, rng), make_tokens(3, 256 * n_blocks, rng)
        alone = [qdot(T.TQ1_0, w, x[i:i + 1], kind)[0] for i in range(3)]
        for n in (2, 3):
            y = qdot(T.TQ1_0, w, x[:n], kind)
            assert all(bits(y[i]) == bits(alone[i]) for i in range(n)), (n_rows, n_blocks, n)


# ---- Hand-overs and builds that differ only in instructions ----

@needs["avx512"]
@pytest.mark.parametrize("t", [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.TQ2_0, T.IQ4_XS, T.NVFP4],
                         ids=lambda t: t.name)
def test_zmm_decode_tiles_hand_4_tokens_and_more_to_the_avx2_build(t):
    """The zmm decode tiles take 1-3 tokens; 4 and more (a prefill tile's leftovers: Q2_K's, Q3_K's and
    IQ4_XS's VNNI tiles leave up to 11 and 7) go to the AVX2 build: the same bytes as it."""
    rng = np.random.default_rng(int(t))
    w = random_weights(t, 5, 512, rng)
    kinds = [k for k in ("kz", "kzgfni", "zmm") if k in kinds_of(BY_NAME[t.name])]
    for n_tok in (4, 5, 7) if t == T.IQ4_XS else (4, 5, 11):
        x = make_tokens(n_tok, 512, rng)
        evex = qdot(t, w, x, "evex")
        for kind in kinds:
            if set(TILE_KINDS[kind].needs) <= HERE:
                assert bits(qdot(t, w, x, kind)) == bits(evex), (t.name, kind, n_tok)
        if t in (*K_VNNI, T.IQ4_XS):   # through the VNNI tile: the leftovers' decode tile passes them on
            assert bits(native.qdot_rows(t, w, 5, 512, x, impl="avx512")) == bits(evex), (t.name, n_tok)


@needs["avx_vnni"]
@pytest.mark.parametrize("t", GRID_TYPES, ids=lambda t: t.name)
def test_the_avx_vnni_build_gives_the_avx2_builds_bits(t):
    """qdot_iq_avx2.c built with AVX-VNNI (one VPDPWSSD where each chunk's products took a VPMADDWD
    and an add): the integer sums are exact in both, so every call gives the same bits."""
    rng = np.random.default_rng(23)
    for n_rows, n_blocks in ((1, 1), (7, 3), (5, 9), (6, 17)):
        w = random_weights(t, n_rows, 256 * n_blocks, rng)
        for n_tok in (1, 2, 3, 4, 5, 8, 17, 40):
            x = make_tokens(n_tok, 256 * n_blocks, rng)
            assert bits(qdot(t, w, x, "avxvnni")) == bits(qdot(t, w, x, "avx2")), (t.name, n_rows, n_blocks, n_tok)


@needs["avx2"]
@pytest.mark.parametrize("impl", ["avx2", pytest.param("avx512", marks=needs["avx512"])])
@pytest.mark.parametrize("t", [T[r.name] for r in TYPES], ids=lambda t: t.name)
def test_new_activations_in_the_same_buffers_are_re_laid(t, impl):
    """Tiles that re-lay activations keep the layout per thread while the activations stay the same:
    products into the same scratch with other tokens must see them (every write of activations bumps
    a serial), at decode and prefill counts, over 1-3 threads and 5 row blocks."""
    rng = np.random.default_rng(3)
    n_rows, row_len = 70, 1024
    w = make_weights(t, n_rows, row_len, rng)
    for n_tok in (1, 2, 3, 28):
        scratch = np.empty(max(native.matmul_scratch_bytes(t, n_tok, row_len), 1), dtype=np.uint8)
        for n_threads in (1, 2, 3):
            with native.ComputePool(n_threads) as pool:
                for seed in (1, 2, 3):
                    x = make_tokens(n_tok, row_len, np.random.default_rng(seed))
                    y = np.full((n_tok, n_rows), np.nan, dtype=np.float32)
                    got = native.matmul_into(pool, t, w, n_rows, row_len, x, y, scratch, impl=impl)
                    want = native.qdot_rows(t, w, n_rows, row_len, x, impl=impl)
                    assert bits(got) == bits(want), (t.name, n_tok, n_threads, seed)


@needs["avx512"]
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to build the stand-alone check")
def test_standalone_c_check_passes(tmp_path):
    """tests/native/qdot_avx512_check.c: the AVX-512 kernels against the scalar ones in C, through
    strata.h alone (for a machine with AVX-512 but without this project's Python environment)."""
    exe = tmp_path / "qdot_avx512_check"
    sources = sorted(str(p) for p in (ROOT / "native").rglob("*.c"))
    includes = [f"-I{d}" for d in {p.parent for p in (ROOT / "native").rglob("*.h")} | {ROOT / "native"}]
    subprocess.run(["gcc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-pthread", "-ffp-contract=off",
                    *includes, *sources, str(ROOT / "tests/native/qdot_avx512_check.c"),
                    "-o", str(exe), "-lm"], check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:]
