"""Packed products of the i-quants, ternary formats and NVFP4 (native/qdot_iq.c: scalar kernels,
which every family runs) held to test_qdot.py's bounds: with A the rounded activations and W
gguf-py's dequantization, |y - W @ A| within float rounding, |y - W @ x| within that plus the
activation rounding; and through the pooled `strata_matmul` (1-3 threads, decode and prefill
token counts) bit for bit equal to the single-threaded kernels, and through the fused MoE call
with a different new type in each of gate, up and down.
"""
from __future__ import annotations

import gguf.quants
import numpy as np
import pytest

from strata import native
from strata.quant import HALF_SCALE_OFFSETS, IQ_TYPES, GGMLType, block_size, random_blocks, set_iq1_m_half
from tests.native import test_matmul as tm
from tests.native.test_matmul import pools  # noqa: F401  (the fixture)
from tests.native.test_qdot import (CASE_IDS, CASES, EXTREME_HALVES, IMPLS, assert_within_bounds, make_tokens,
                                    numpy_qact, qdot_case)

T = GGMLType
GRID_TYPES = (T.IQ2_XXS, T.IQ3_XXS, T.IQ2_XS, T.IQ3_S, T.IQ2_S, T.IQ1_S, T.IQ1_M)
# Element magnitudes ~0.03 from random codes: the d each type needs (its grids and scales differ).
SCALES = {T.IQ1_S: 0.01, T.IQ1_M: 0.01, T.IQ2_XXS: 0.0015, T.IQ2_XS: 0.0015, T.IQ2_S: 0.0015,
          T.IQ3_XXS: 0.0005, T.IQ3_S: 0.0005, T.IQ4_NL: 0.001, T.IQ4_XS: 0.0001, T.TQ1_0: 0.05,
          T.TQ2_0: 0.05, T.NVFP4: 0.005}
EXTREME_UE4M3 = np.array([0x00, 0x01, 0x08, 0x7E, 0x7F, 0xFF], dtype=np.uint8)


def make_weights(t: GGMLType, n_rows: int, row_len: int, rng: np.random.Generator) -> np.ndarray:
    """[n_rows, row bytes]: valid random blocks, ~30% of them with an extreme scale (zero,
    subnormal, 65504; NVFP4: the smallest, largest and zero UE4M3 codes)."""
    elems, nbytes = block_size(t)
    n_blocks = n_rows * row_len // elems
    blocks = random_blocks(t, n_blocks, rng, SCALES[t]).reshape(n_blocks, nbytes)
    picked = np.flatnonzero(rng.random(n_blocks) < 0.3)
    if t == T.NVFP4:
        blocks[picked, rng.integers(0, 4, len(picked))] = rng.choice(EXTREME_UE4M3, len(picked))
    elif t == T.IQ1_M:
        sub = blocks[picked]
        set_iq1_m_half(sub, rng.choice(EXTREME_HALVES, len(picked)))
        blocks[picked] = sub
    else:
        for off in HALF_SCALE_OFFSETS[t]:
            blocks[picked, off:off + 2] = rng.choice(EXTREME_HALVES, len(picked)).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(n_rows, -1)


def row_len_of(t: GGMLType, n_blocks: int) -> int:
    return n_blocks * block_size(t)[0]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_activation_rows_are_the_q8_formats(t, impl):
    x = make_tokens(3, 512, np.random.default_rng(int(t)))
    expected, _, _ = numpy_qact(t, x)
    assert np.array_equal(native.quantize_act(t, x, impl=impl), expected)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_qdot_within_bounds_of_float64(t, case, impl):
    w, x, y = qdot_case(t, case, impl, make_weights, row_len_of)
    wd = gguf.quants.dequantize(w, t).reshape(w.shape[0], x.shape[1]).astype(np.float64)
    assert np.isfinite(wd).all()
    assert_within_bounds(t, impl, y, x, wd, np.abs(wd))


# Types with AVX2 kernels of their own (native/qdot_iq4_avx2.c; tested in test_qdot_iq4_avx2.py).
IQ4_AVX2_TYPES = (T.IQ4_NL, T.IQ4_XS, T.TQ1_0, T.TQ2_0, T.NVFP4)


def test_every_family_runs_the_scalar_kernel():
    rng = np.random.default_rng(5)
    for t in IQ_TYPES:
        assert native.has_qdot_kernel(t, "scalar")
        # IQ4_NL's 8-row tiles (test_qdot_avx512.py), the grid i-quants' and IQ4_XS's VNNI prefill
        # (test_qdot_iq_vnni.py), TQ1_0's decode (test_qdot_tq1_avx512.py)
        assert native.has_qdot_kernel(t, "avx512") == (t in (T.IQ4_NL, T.IQ4_XS, T.TQ1_0) or t in GRID_TYPES), t.name
        if native.has_qdot_kernel(t, "avx2"):
            continue  # its own AVX2 kernel: test_qdot_iq_grid_avx2.py, test_qdot_iq4_avx2.py
        row_len = 2 * 256
        w, x = make_weights(t, 6, row_len, rng), make_tokens(3, row_len, rng)
        ys = native.qdot_rows(t, w, 6, row_len, x, impl="scalar")
        yd = native.qdot_rows(t, w, 6, row_len, x)  # the default family falls back to it
        assert np.array_equal(ys.view(np.uint32), yd.view(np.uint32)), t.name


@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_pooled_matmul_equals_the_kernels_for_every_thread_count(pools, t):  # noqa: F811
    row_len = 512
    for n_tokens in (1, 3, 64):
        for n_rows in (1, 17, 97):
            w = random_blocks(t, n_rows * row_len // block_size(t)[0], np.random.default_rng(n_rows), SCALES[t])
            x = tm.activations(n_tokens, row_len, seed=n_tokens)
            want = native.qdot_rows(t, w, n_rows, row_len, x)
            for n in (None, 1, 2, 3):
                got = tm.matmul(pools[n], t, w, n_rows, x)
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
        scale = SCALES.get(t, 0.01)
        data = random_blocks(t, tm.N_HELD * n_rows * row_len // block_size(t)[0], rng, scale)
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
