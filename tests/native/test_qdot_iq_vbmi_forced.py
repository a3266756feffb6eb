"""The grid i-quants' gather decode tiles (native/qdot_iq_vbmi.c) on a CPU that has AVX-512 VBMI and
GFNI but whose gathers the kernel table calls slow (Zen 4, where they measured 0.73-0.94x the AVX2
build, native/qdot.c): the table never hands them out there, so test_qdot_iq_vbmi.py skips in
process; STRATA_VBMI=1 turns them on, and this runs that whole file in a child under it, so that
the tiles' code is still checked against the scalar twins on such CPUs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from strata import native

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not native.cpu_has_avx512_vbmi() or native.cpu_fast_gathers(),
                    reason="CPU without AVX-512 VBMI and GFNI, or with fast gathers (test_qdot_iq_vbmi.py runs in process)")
def test_gather_tiles_forced_on_match_their_scalar_twins():
    env = {k: v for k, v in os.environ.items() if k not in ("STRATA_FORCE_AVX2", "STRATA_FORCE_SCALAR")}
    env.update(PYTHONPATH=str(ROOT), STRATA_VBMI="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/native/test_qdot_iq_vbmi.py"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    tail = done.stdout[-2000:]
    assert done.returncode == 0 and " passed" in tail and "skipped" not in tail, tail + done.stderr[-2000:]
