"""Every packed matrix kernel and the dequantizer read only the weight bytes they are given.

The weights of each packed type are laid against a page the process may not touch (PROT_NONE):
once ending on the byte before it, once starting on the byte after it. Every kernel family this CPU
has (scalar, AVX2, AVX-512 and the kernel table's own choice), decode and prefill token counts,
row and block counts that leave tails in the tiles' row groups and block chunks. A read past either
end (a vector load of a whole last block's neighbourhood, a gather of a dword that starts at a
block's last field) is a segmentation fault: the cases run in a child process, which names the case
it was in when it died. The kernel table's alternatives on AVX-512 machines (STRATA_KERNEL: the planes
tiles off, the gather tiles off, AVX-512's own tiles first) run as further children.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from strata import native

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import ctypes, mmap, sys
import numpy as np
from strata import native
from strata.native.dequant import dequantize
from strata.native.qdot import qdot_rows
from strata.quant import DEQUANT_TYPES, block_size, random_blocks

libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
PAGE = mmap.PAGESIZE
IMPLS = ["auto", "scalar"] + (["avx2"] if native.cpu_has_avx2() else []) + (["avx512"] if native.cpu_has_avx512() else [])
SHAPES = [(1, 1), (3, 2), (17, 17)]    # (rows, blocks of 256 values per row)
TOKENS = [1, 2, 3, 4, 7, 17]
rng = np.random.default_rng(7)
n_calls = 0
for t in DEQUANT_TYPES:
    for n_rows, n_blocks in SHAPES:
        row_len = 256 * n_blocks
        w = random_blocks(t, n_rows * row_len // block_size(t)[0], rng)
        pages = (w.nbytes + PAGE - 1) // PAGE
        region = mmap.mmap(-1, (pages + 2) * PAGE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(region))
        for at in (base, base + (pages + 1) * PAGE):
            if libc.mprotect(at, PAGE, 0) != 0:
                raise OSError(ctypes.get_errno(), "mprotect")
        for where, offset in (("ends at", (pages + 1) * PAGE - w.nbytes), ("starts at", PAGE)):
            view = np.frombuffer(region, dtype=np.uint8, count=w.nbytes, offset=offset)
            view[:] = w
            for impl in IMPLS:
                for n_tok in TOKENS:
                    x = rng.standard_normal((n_tok, row_len), dtype=np.float32)
                    print(f"{t.name} {impl} rows {n_rows} blocks {n_blocks} tokens {n_tok}, weights {where} a guard page",
                          flush=True)
                    y = qdot_rows(t, view, n_rows, row_len, x, impl=impl)
                    if not np.isfinite(y).all():
                        raise SystemExit(f"{t.name} {impl}: non-finite output")
                    n_calls += 1
            for impl in IMPLS:   # the dequantizer reads the same bytes
                print(f"{t.name} dequantize {impl} rows {n_rows} blocks {n_blocks}, weights {where} a guard page", flush=True)
                out = dequantize(t, view, (n_rows, row_len), impl=impl)
                n_calls += 1
            del view
print(f"ok {n_calls}", flush=True)
"""


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    env.update(extra)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_child(extra: dict[str, str]) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=child_env(extra), capture_output=True,
                          text=True, timeout=600)
    lines = proc.stdout.strip().splitlines()
    last = lines[-1] if lines else "(nothing)"
    assert proc.returncode == 0, (f"{extra or 'default kernels'}: child exited with {proc.returncode} "
                                  f"(a negative number is the signal) in: {last}\n{proc.stderr[-2000:]}")
    assert last.startswith("ok "), last


def test_every_kernel_stays_within_its_weights():
    run_child({})


ALTERNATIVES = [{"STRATA_KERNEL": "-planes -kzgfni +ymm_gathers"},
                {"STRATA_KERNEL": "-planes -vbmi -kz -kzgfni -zmm -ymm_gathers -avxvnni"},
                {"STRATA_KERNEL": "+avx512"}]


@pytest.mark.skipif(not native.cpu_has_avx512(), reason="CPU has no AVX-512: no kernel table alternatives to run")
@pytest.mark.parametrize("extra", ALTERNATIVES, ids=["planes-off-zmm-plain", "gathers-off-zmm-off", "own-tiles"])
def test_the_kernel_tables_alternatives_stay_within_their_weights(extra):
    run_child(extra)
