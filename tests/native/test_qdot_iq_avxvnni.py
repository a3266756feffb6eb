"""The grid i-quants' AVX2 tiles built with AVX-VNNI (native/qdot_iq_avxvnni.c: qdot_iq_avx2.c with one
VEX-encoded VPDPWSSD where each chunk's products took a VPMADDWD and an add). The AVX2 family runs them
for decode and prefill where the CPU has AVX-VNNI (Intel's Alder Lake and later client cores, and this
Xeon's kind); STRATA_AVX_VNNI=0 takes the plain AVX2 build. The integer sums are exact in both, so
every call gives the same bits either way: children with STRATA_AVX_VNNI=0 (grid rows by scalar loads
and by gathers) make the same calls as this process, each result is held within the rounding bound of
the scalar twin (test_qdot_iq_grid_avx2's check), and the kernel table's choice is asserted. Skipped
where the CPU has no AVX-VNNI."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from strata import native
from strata.native.qdot import avx_vnni_tile
from strata.quant import GGMLType
from tests.native.test_qdot_avx512 import ROOT, child_env
from tests.native.test_qdot_iq_grid_avx2 import GRID_TYPES

T = GGMLType
pytestmark = pytest.mark.skipif(not (native.cpu_has_avx2() and native.cpu_avx_vnni()),
                                reason="CPU without AVX2 and AVX-VNNI (or STRATA_AVX_VNNI=0)")

# The calls each process makes: one block and several, rows one at a time (1-4 tokens) and 4 at a
# time with a leftover (prefill over unpacked rows, 5 tokens on), windows of 8 blocks and a shorter one.
CALLS = r"""
import sys
import numpy as np
from strata import native
from strata.native.qdot import avx_vnni_tile
from strata.quant import random_blocks
from tests.native.test_qdot import make_tokens
from tests.native.test_qdot_iq_grid_avx2 import GRID_TYPES, assert_close_to_scalar
from tests.native.test_qdot_iquants import SCALES

vnni = sys.argv[1] == "1"
assert native.cpu_avx_vnni() == vnni
rng = np.random.default_rng(23)
out = []
for t in GRID_TYPES:
    assert avx_vnni_tile(t, "avx2", True) == vnni and avx_vnni_tile(t, "avx2", False) == vnni, t.name
    for n_rows, n_blocks in ((1, 1), (7, 3), (5, 9), (6, 17)):
        row_len = 256 * n_blocks
        w = random_blocks(t, n_rows * n_blocks, rng, SCALES[t])
        for n_tok in (1, 2, 3, 4, 5, 8, 17, 40):
            x = make_tokens(n_tok, row_len, rng)
            assert_close_to_scalar(t, w.reshape(n_rows, -1), n_rows, x, f"avx_vnni={vnni} {n_rows}x{n_blocks}x{n_tok}")
            out.append(native.qdot_rows(t, w, n_rows, row_len, x, impl="avx2"))
np.save(sys.argv[2], np.concatenate([o.ravel() for o in out]))
"""


def calls(vnni: bool, path, **env: str) -> np.ndarray:
    """The calls' outputs from a child with AVX-VNNI on or off (and `env`)."""
    run = subprocess.run([sys.executable, "-c", CALLS, "1" if vnni else "0", str(path)], cwd=ROOT,
                         env=child_env(STRATA_AVX_VNNI="1" if vnni else "0", **env), capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, f"STRATA_AVX_VNNI={int(vnni)} {env}: {run.stderr[-3000:]}"
    return np.load(path)


def test_the_avx2_family_runs_the_avx_vnni_build_for_decode_and_prefill():
    for t in GRID_TYPES:
        assert avx_vnni_tile(t, "avx2", True) and avx_vnni_tile(t, "avx2", False), t.name
    # TQ1_0 decodes with a tile of its own (test_qdot_tq1_avxvnni.py) and prefills with the AVX2 one
    assert avx_vnni_tile(T.TQ1_0, "avx2", True) and not avx_vnni_tile(T.TQ1_0, "avx2", False)
    for t in (T.Q4_0, T.Q8_0, T.Q4_K, T.Q2_K, T.IQ4_XS, T.TQ2_0):
        assert not avx_vnni_tile(t, "avx2", True) and not avx_vnni_tile(t, "avx2", False), t.name
    for t in GRID_TYPES:   # the scalar family, and AVX-512 calls, which have builds of their own
        assert not avx_vnni_tile(t, "scalar", True)
        if native.cpu_has_avx512():
            assert not avx_vnni_tile(t, "avx512", True) and not avx_vnni_tile(t, "avx512", False), t.name


def test_both_builds_give_the_same_bits_within_the_bound(tmp_path):
    """This CPU's gathers setting and the other one, without AVX-VNNI, against the AVX-VNNI build."""
    with_vnni = calls(True, tmp_path / "vnni.npy")
    assert with_vnni.size > 0 and np.isfinite(with_vnni).all()
    for gathers in ("0", "1"):
        plain = calls(False, tmp_path / f"plain{gathers}.npy", STRATA_AVX2_GATHERS=gathers)
        assert plain.view(np.uint32).tobytes() == with_vnni.view(np.uint32).tobytes(), f"STRATA_AVX2_GATHERS={gathers}"
