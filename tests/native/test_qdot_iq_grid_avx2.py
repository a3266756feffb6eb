"""AVX2 packed products of the grid i-quants (native/qdot_iq_avx2.c) against their scalar twins
(native/qdot_iq.c).

Both compute each weight block's integer dot product exactly; only the order in which the
per-block float terms are added differs. So, as in test_qdot.py, the AVX2 result is held within
twice the float-rounding bound of the scalar one: n * 2^-24 * (|A| @ |W|) + n * 2^-140 with A the
rounded activations, W gguf-py's dequantization and n = blocks per row + 16. Shapes cover odd row
counts, one block and several per row, every token count 1..33 (the tiles of 1-4 tokens, and the
prefill over unpacked rows from 5 on: 4 rows at a time and the last 1-3, windows of 8 blocks and a
last shorter one); weights carry extreme half scales; saturation-prone
blocks (every code byte 0x00 or 0xFF, so the largest grid values and scales) meet activations of
+-127 of one sign. Through the pooled `strata_matmul` (1-3 threads) the AVX2 kernels equal the
single-threaded ones bit for bit.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from strata import native
from strata.quant import HALF_SCALE_OFFSETS, GGMLType, block_size, random_blocks, set_iq1_m_half
from tests.native import test_matmul as tm
from tests.native.test_matmul import pools  # noqa: F401  (the fixture)
from tests.native.test_qdot import U, make_tokens, numpy_qact
from tests.native.test_qdot_avx512 import ROOT, child_env
from tests.native.test_qdot_iquants import SCALES, make_weights

T = GGMLType
GRID_TYPES = (T.IQ2_XXS, T.IQ3_XXS, T.IQ2_XS, T.IQ3_S, T.IQ2_S, T.IQ1_S, T.IQ1_M)
pytestmark = pytest.mark.skipif(not native.cpu_has_avx2(), reason="CPU has no AVX2/FMA/F16C")

# (rows, blocks per row, tokens): odd row counts, 1-5 blocks, decode and prefill token counts.
SHAPES = [(1, 1, 1), (7, 3, 1), (13, 2, 2), (5, 4, 3), (9, 1, 4), (3, 2, 5), (11, 2, 7), (17, 3, 8),
          (5, 2, 9), (7, 1, 13), (3, 5, 16), (9, 2, 17), (5, 3, 33), (6, 8, 6), (7, 9, 5), (4, 17, 12),
          (2, 16, 40)]


def assert_close_to_scalar(t: GGMLType, w: np.ndarray, n_rows: int, x: np.ndarray, what: str,
                           impl: str = "avx2") -> None:
    row_len = x.shape[1]
    ys = native.qdot_rows(t, w, n_rows, row_len, x, impl="scalar").astype(np.float64)
    ya = native.qdot_rows(t, w, n_rows, row_len, x, impl=impl).astype(np.float64)
    _, _, a = numpy_qact(t, x)
    wd = np.abs(native.dequantize(t, w, (n_rows, row_len)).astype(np.float64))
    n = row_len // block_size(t)[0] + 16
    tol = 2 * (n * U * (np.abs(a) @ wd.T) + n * 2.0 ** -140)
    err = np.abs(ya - ys)
    assert np.isfinite(ya).all() == np.isfinite(ys).all(), f"{t.name} {what}: finiteness differs"
    assert (err <= tol).all(), f"{t.name} {what}: {impl} differs from scalar by {err.max()} (bound {tol.max()})"


def test_the_grid_types_have_avx2_kernels():
    for t in GRID_TYPES:  # and AVX-512 prefill tiles of their own (test_qdot_iq_vnni.py)
        assert native.has_qdot_kernel(t, "avx2") and native.has_qdot_kernel(t, "avx512"), t.name


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"N{s[0]}-B{s[1]}-T{s[2]}")
@pytest.mark.parametrize("t", GRID_TYPES, ids=lambda t: t.name)
def test_avx2_matches_scalar(t, shape):
    check_shape(t, shape, "avx2")


def check_shape(t: GGMLType, shape: tuple[int, int, int], impl: str) -> None:
    """Random weights (rows, blocks per row) against random tokens: `impl` within the bound."""
    n_rows, n_blocks, n_tok = shape
    rng = np.random.default_rng(int(t) * 100 + n_rows * 7 + n_tok)
    row_len = n_blocks * 256
    w = make_weights(t, n_rows, row_len, rng)
    assert_close_to_scalar(t, w, n_rows, make_tokens(n_tok, row_len, rng), f"shape {shape}", impl=impl)


@pytest.mark.parametrize("t", GRID_TYPES, ids=lambda t: t.name)
def test_every_token_count_up_to_33(t):
    rng = np.random.default_rng(int(t))
    n_rows, row_len = 3, 2 * 256
    w = make_weights(t, n_rows, row_len, rng)
    x = make_tokens(33, row_len, rng)
    for n_tok in range(1, 34):
        assert_close_to_scalar(t, w, n_rows, x[:n_tok], f"{n_tok} tokens")


def _uniform_blocks(t: GGMLType, n_blocks: int, byte: int) -> np.ndarray:
    """Blocks whose every byte is `byte` but for the half d, set to 1.0."""
    blocks = np.full((n_blocks, block_size(t)[1]), byte, dtype=np.uint8)
    one = np.full(n_blocks, 0x3C00, dtype="<u2")
    if t == T.IQ1_M:
        set_iq1_m_half(blocks, one)
    else:
        for off in HALF_SCALE_OFFSETS[t]:
            blocks[:, off:off + 2] = one.view(np.uint8).reshape(-1, 2)
    return blocks


@pytest.mark.parametrize("t", GRID_TYPES, ids=lambda t: t.name)
def test_largest_codes_and_activations_do_not_saturate(t):
    """All-0xFF and all-0x00 code bytes (the largest scales, grid rows of the largest values for
    several types) against activations all +127 or all -127: int16 pair sums at their largest."""
    row_len = 2 * 256
    w = np.concatenate([_uniform_blocks(t, 2, 0xFF), _uniform_blocks(t, 2, 0x00),
                        random_blocks(t, 2, np.random.default_rng(3), SCALES[t]).reshape(2, -1)]).reshape(3, -1)
    x = np.stack([np.full(row_len, 1.0, np.float32), np.full(row_len, -2.0, np.float32),
                  np.where(np.arange(row_len) % 3, 1.0, -1.0).astype(np.float32)])
    assert_close_to_scalar(t, w, 3, x, "extreme codes")
    ys = native.qdot_rows(t, w, 3, row_len, x, impl="scalar")
    assert np.abs(ys).max() > 0


@pytest.mark.parametrize("t", GRID_TYPES, ids=lambda t: t.name)
def test_pooled_matmul_equals_the_avx2_kernels(pools, t):  # noqa: F811
    row_len = 3 * 256
    for n_tokens in (1, 2, 3, 9, 33):
        for n_rows in (1, 17, 601):
            w = random_blocks(t, n_rows * row_len // 256, np.random.default_rng(n_rows), SCALES[t])
            x = tm.activations(n_tokens, row_len, seed=n_tokens)
            want = native.qdot_rows(t, w, n_rows, row_len, x, impl="avx2")
            for n in (None, 1, 2, 3):
                got = tm.matmul(pools[n], t, w, n_rows, x, impl="avx2")
                assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), (t.name, n_rows, n_tokens, n)
            assert_close_to_scalar(t, w.reshape(n_rows, -1), n_rows, x, f"matmul {n_rows}x{n_tokens}")


# ---- Grid rows by ymm gathers (STRATA_AVX2_GATHERS; native/qdot_iq_chunks.h, gather_rows8) ----
# IQ2_S's, IQ3_XXS's, IQ3_S's, IQ1_S's and IQ1_M's chunks fetch their grid rows by gathers where
# strata_cpu_fast_ymm_gathers says so (an Intel CPU not affected by Gather Data Sampling), by scalar
# loads elsewhere. Both fetch the same bytes, so each call's outputs are the same bits either way: the
# AVX2 tiles (1-4 tokens), the prefill over unpacked rows (5 on) and, on AVX-512, the VNNI prefill
# tiles that unpack with the same chunks. The choice is made once per process: a child per setting.
GATHER_CHILD = r"""
import sys
import numpy as np
from strata import native
from strata.quant import GGMLType as T, random_blocks
from tests.native.test_qdot import make_tokens
from tests.native.test_qdot_iq_grid_avx2 import GRID_TYPES, assert_close_to_scalar
from tests.native.test_qdot_iquants import SCALES

want = sys.argv[1] == "1"
assert native.cpu_fast_ymm_gathers() == want
impls = ["avx2"] + (["avx512"] if native.cpu_has_avx512() else [])
rng = np.random.default_rng(5)
out = []
for t in GRID_TYPES:
    for n_rows, n_blocks in ((1, 1), (7, 3), (5, 9)):
        row_len = 256 * n_blocks
        w = random_blocks(t, n_rows * n_blocks, rng, SCALES[t])
        for n_tok in (1, 2, 3, 4, 5, 8, 17, 40):
            x = make_tokens(n_tok, row_len, rng)
            for impl in impls:
                assert_close_to_scalar(t, w.reshape(n_rows, -1), n_rows, x, f"gathers={want} {impl}", impl=impl)
                out.append(native.qdot_rows(t, w, n_rows, row_len, x, impl=impl))
np.save(sys.argv[2], np.concatenate([o.ravel() for o in out]))
"""


def test_gathered_grid_rows_give_the_same_bits_as_scalar_loads(tmp_path):
    results = {}
    for setting in ("0", "1"):
        path = tmp_path / f"gathers{setting}.npy"
        run = subprocess.run([sys.executable, "-c", GATHER_CHILD, setting, str(path)], cwd=ROOT,
                             env=child_env(STRATA_AVX2_GATHERS=setting), capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, f"STRATA_AVX2_GATHERS={setting}: {run.stderr[-3000:]}"
        results[setting] = np.load(path)
    assert results["0"].size > 0
    assert results["0"].view(np.uint32).tobytes() == results["1"].view(np.uint32).tobytes()
