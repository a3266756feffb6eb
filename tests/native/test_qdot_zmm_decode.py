"""zmm decode tiles of the formats whose decode had run the AVX2 build on AVX-512 machines: the K-quants
and TQ2_0 (native/qdot_kquant_zmm.c and its GFNI build, qdot_kquant_zmm_gfni.c), IQ4_XS
(native/qdot_iq4_xs_avx512.c) and NVFP4 (native/qdot_nvfp4_avx512.c), against their scalar twins.

Decode calls (1-3 tokens) on AVX-512 run them where the CPU does not split 512-bit operations
(STRATA_ZMM_DECODE=1 forces them, =0 turns them off, =plain takes the builds without GFNI). Their
integer sums are the scalar tile's; the float steps add per lane and sum at the row's end, so
outputs are held within twice the rounding bound (test_qdot_iq_grid_avx2.py's), on random blocks
with extreme scales, on the largest and smallest codes against the largest activations (Q2_K's and
Q6_K's sums packed to int16 at their largest), and on every row and block count the tile walks.
IQ4_XS's and NVFP4's activations are re-laid once per call and thread: products from the same buffers with new
contents, pooled over several threads, must not see a stale layout. 4 tokens and more handed to
them (a prefill tile's leftovers) go to the AVX2 build: the same bytes as it. Each build runs in a
child process of its own (the choice is made once per process).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from strata import native
from strata.native.qdot import kernel_family
from strata.quant import GGMLType
from tests.native.test_qdot_avx512 import child_env

T = GGMLType
ZMM_TYPES = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.TQ2_0, T.IQ4_XS, T.NVFP4)
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not native.cpu_has_avx512(), reason="CPU has no AVX-512 (F/BW/VL/VNNI): "
                                                                    "the tiles cannot run here")
ON_BY_DEFAULT = not native.cpu_splits_512()

CHILD = r"""
import sys
import numpy as np
import torch
from strata import native
from strata.native.qdot import kernel_family
from strata.quant import GGMLType as T, HALF_SCALE_OFFSETS, block_size
from tests.native.test_qdot import make_tokens
from tests.native.test_qdot_iq_grid_avx2 import assert_close_to_scalar
from tests.native.test_qdot_iq_vnni import make_weights

on = sys.argv[1] == "on"
rng = np.random.default_rng(11)
for t in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.TQ2_0, T.IQ4_XS, T.NVFP4):
    assert kernel_family(t, "avx512", decode=True) == ("avx512" if on else "avx2"), t.name
    # (rows, blocks per row): one block, odd rows, rows of many blocks (the row's float sum)
    for n_rows, n_blocks in ((1, 1), (7, 3), (13, 2), (3, 17), (2, 48)):
        row_len = 256 * n_blocks
        w = make_weights(t, n_rows, row_len, rng)
        for n_tok in (1, 2, 3):
            x = make_tokens(n_tok, row_len, rng)
            assert_close_to_scalar(t, w, n_rows, x, f"{n_rows} x {n_blocks} blocks, {n_tok} tokens", impl="avx512")
    assert native.qdot_rows(t, w, n_rows, row_len, np.zeros((0, row_len), np.float32), impl="avx512").shape == (0, n_rows)
    # the largest codes (all bits set: Q3_K's hmask too) and the largest scales, against activations
    # all of one sign (every activation byte 127): the sums packed to int16 at their largest
    per_row, nb = 512 // block_size(t)[0], block_size(t)[1]
    blocks = np.full((3 * per_row, nb), 0xFF, np.uint8)
    blocks[per_row:2 * per_row] = 0   # IQ4_XS: code 0 is its value of largest magnitude, -127
    blocks[2 * per_row:] = rng.integers(0, 256, (per_row, nb), dtype=np.uint8)
    for off in HALF_SCALE_OFFSETS.get(t, ()):   # NVFP4's scales are UE4M3 bytes: all 0xFF (240) and 0
        blocks[:, off:off + 2] = np.array([0x3C00], "<u2").view(np.uint8)
    w = blocks.reshape(3, -1)
    x = np.stack([np.full(512, 1.0, np.float32), np.full(512, -3.0, np.float32), np.where(np.arange(512) % 2, 1.0, -1.0)]).astype(np.float32)
    assert_close_to_scalar(t, w, 3, x, "extreme codes", impl="avx512")
    assert np.abs(native.qdot_rows(t, w, 3, 512, x, impl="scalar")).max() > 0
    # the pooled product, 1 and 3 threads, twice from the same buffers with new contents
    w = torch.from_numpy(make_weights(t, 70, 768, rng))
    for n_tok in (1, 3):
        x, out = torch.empty(n_tok, 768), torch.empty(n_tok, 70)
        scratch = torch.empty(native.matmul_scratch_bytes(t, n_tok, 768), dtype=torch.uint8)
        for threads in (1, 3):
            with native.ComputePool(threads) as pool:
                for _ in range(2):
                    x.copy_(torch.from_numpy(make_tokens(n_tok, 768, rng)))
                    native.matmul_into(pool, t, w, 70, 768, x, out, scratch, impl="avx512")
                    assert_close_to_scalar(t, w.numpy(), 70, x.numpy(), f"pooled, {threads} threads", impl="avx512")
                    got = native.qdot_rows(t, w.numpy(), 70, 768, x.numpy(), impl="avx512")
                    assert np.array_equal(out.numpy(), got), (t.name, n_tok, threads)
    # 4-11 tokens: Q2_K's, Q3_K's and IQ4_XS's (fewer than their VNNI tile's last group takes: 11, 7)
    # come here and go on to the AVX2 build; the others' are the prefill tile's the table names
    w = make_weights(t, 5, 512, rng)
    want = "avx2" if t in (T.Q2_K, T.Q3_K, T.IQ4_XS) else kernel_family(t, "avx512", decode=False)
    for n_tok in (4, 5, 7) if t == T.IQ4_XS else (4, 5, 11):
        x = make_tokens(n_tok, 512, rng)
        got = native.qdot_rows(t, w, 5, 512, x, impl="avx512")
        assert got.tobytes() == native.qdot_rows(t, w, 5, 512, x, impl=want).tobytes(), (t.name, n_tok)
print("ok")
"""


def run_child(on: bool, **env: str) -> None:
    full = child_env(**env)
    if "STRATA_ZMM_DECODE" not in env:
        full.pop("STRATA_ZMM_DECODE", None)
    done = subprocess.run([sys.executable, "-c", CHILD, "on" if on else "off"], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["ok"], (env, done.stderr[-3000:])


def test_decode_by_default_matches_scalar():
    """The build this CPU takes (GFNI where it has VBMI and GFNI), where 512-bit operations are not
    split; where they are (Zen 4), decode stays on the AVX2 build."""
    run_child(ON_BY_DEFAULT)


def test_the_builds_without_gfni_match_scalar():
    run_child(True, STRATA_ZMM_DECODE="plain")


@pytest.mark.skipif(not native.cpu_has_avx512_vbmi(), reason="CPU without AVX-512 VBMI and GFNI: the default "
                                                             "is the build without GFNI, run above")
def test_the_gfni_build_forced_matches_scalar():
    run_child(True, STRATA_ZMM_DECODE="1")


def test_turned_off_decode_runs_the_avx2_build():
    run_child(False, STRATA_ZMM_DECODE="0")


@pytest.mark.parametrize("t", ZMM_TYPES, ids=lambda t: t.name)
def test_the_table_names_the_tiles(t):
    assert kernel_family(t, "avx512", decode=True) == ("avx512" if ON_BY_DEFAULT else "avx2")
    assert kernel_family(t, "avx2", decode=True) == "avx2"
    if native.default_impl() == "avx512":
        assert native.type_support(t).decode_runs == kernel_family(t, "avx512", decode=True)
