"""The choice of tile (strata_qdot_select, native/kernels/qdot.c) read from the table of quant types
against a CPU description: for CPUs this machine is not (made-up descriptions of an Intel core with
every extension, Zen 4, Zen 5 and an AVX2-only EPYC), for this one as detected, under the one override
STRATA_KERNEL (children, since it is read once per process), and the calls the choice hands out.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from strata import native
from strata.native._lib import lib
from strata.native.qdot import CpuDesc, cpu, kernel_family, select
from strata.quant import GGMLType
from strata.quant_table import TILE_KINDS, TYPES
from tests.native.qdot_cases import ALL, bits, make_tokens, random_weights

T = GGMLType
ROOT = Path(__file__).resolve().parents[2]
HERE = cpu()
EVERYTHING = frozenset({"avx2", "avx512", "vbmi_gfni", "avx_vnni", "fast_gathers", "ymm_gathers"})
INTEL = CpuDesc("intel", 6, EVERYTHING)
ZEN4 = CpuDesc("amd", 0x19, frozenset({"avx2", "avx512", "vbmi_gfni"}))   # gathers slow, no AVX-VNNI
ZEN5 = CpuDesc("amd", 0x1A, EVERYTHING - {"ymm_gathers"})
EPYC_AVX2 = CpuDesc("amd", 0x19, frozenset({"avx2"}))

GRID = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")
# (AVX2 decode, AVX2 prefill, AVX-512 decode, AVX-512 prefill) on the Intel core with every extension
ON_INTEL = {"F32": "avx2 avx2 evex evex", "Q8_0": "avx2 avx2 evex avx512", "Q4_K": "avx2 avx2 kzgfni evex",
            "Q5_K": "avx2 avx2 kzgfni evex", "IQ4_XS": "avx2 avx2 zmm avx512", "TQ1_0": "avxvnni avx2 avx512 evex",
            "TQ2_0": "avx2 avx2 kzgfni evex", "NVFP4": "avx2 avx2 zmm evex",
            **{n: "avx2 avx2 avx512 avx512" for n in ("F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4", "IQ4_NL")},
            **{n: "avx2 avx2 kzgfni avx512" for n in ("Q2_K", "Q3_K", "Q6_K")},
            **{n: "avxvnni avxvnni planes avx512" for n in GRID}}
# Zen 4 splits 512-bit operations and its gathers are slow, and it has no AVX-VNNI: every decode tile
# plain AVX-512 ones (and TQ1_0's, which whole 512-bit operations need) gives way to the AVX2 build
def _on_zen4(name: str, on_intel: str) -> str:
    _, _, decode, prefill = on_intel.split()
    return f"avx2 avx2 {decode if decode == 'avx512' and name != 'TQ1_0' else 'evex'} {prefill}"


ON_ZEN4 = {n: _on_zen4(n, c) for n, c in ON_INTEL.items()}
# Zen 5 (AMD family 1Ah): as Intel, but Q4_0's decode, where the AVX2 tile measured faster
# (benchmarks/RESULTS.md, "Kernel choice per CPU")
ON_ZEN5 = {**ON_INTEL, "Q4_0": "avx2 avx2 evex avx512"}


def choices(desc: CpuDesc) -> dict[str, str]:
    return {row.name: " ".join(select(row.name, impl, n, desc) for impl in ("avx2", "avx512") for n in (1, 4))
            for row in TYPES}


@pytest.mark.parametrize("desc, want", [(INTEL, ON_INTEL), (ZEN4, ON_ZEN4), (ZEN5, ON_ZEN5)], ids=["intel", "zen4", "zen5"])
def test_the_choice_on_made_up_cpus(desc, want):
    assert choices(desc) == want
    assert all(select(row.name, "scalar", n, desc) == "ref" for row in TYPES for n in (1, 4))


def test_zen5_decodes_q4_0_with_the_avx2_tile_unless_told():
    assert select("Q4_0", "avx512", 1, ZEN5) == "evex" and select("Q4_0", "avx512", 4, ZEN5) == "avx512"
    assert select("Q4_0", "avx512", 1, ZEN5._replace(prefer=frozenset({"avx512"}))) == "avx512"
    assert select("Q4_0", "avx512", 1, INTEL) == select("Q4_0", "avx512", 1, ZEN4) == "avx512"


def test_an_avx2_cpu_runs_the_avx2_tiles_and_no_avx512_family():
    assert all(select(row.name, "avx2", n, EPYC_AVX2) == "avx2" for row in TYPES for n in (1, 4))
    with pytest.raises(ValueError, match="no packed kernel for 'avx512'"):
        select("Q4_0", "avx512", 1, EPYC_AVX2)


def test_preferred_kinds_come_first_and_excluded_ones_never():
    """STRATA_KERNEL's +kind and -kind, as a description carries them."""
    prefer = lambda *k: INTEL._replace(prefer=frozenset(k))   # noqa: E731
    exclude = lambda *k: INTEL._replace(exclude=frozenset(k))   # noqa: E731
    assert [select(n, "avx512", p, prefer("avx512")) for n, p in (("Q4_K", 1), ("Q4_K", 4), ("Q8_0", 1),
                                                                 ("TQ1_0", 4), ("IQ2_XXS", 1))] == ["avx512"] * 5
    assert {select(n, "avx512", 1, exclude("planes")) for n in GRID} == {"vbmi"}
    assert {select(n, "avx512", 1, exclude("planes", "vbmi")) for n in GRID} == {"evex"}
    assert {select(n, "avx512", 1, exclude("kzgfni")) for n in ("Q2_K", "Q4_K", "Q6_K", "TQ2_0")} == {"kz"}
    assert {select(n, "avx512", 1, exclude("kz", "kzgfni", "zmm")) for n in ("Q2_K", "Q6_K", "IQ4_XS", "NVFP4")} == {"evex"}
    assert {select(n, "avx2", p, exclude("avxvnni")) for n in (*GRID, "TQ1_0") for p in (1, 4)} == {"avx2"}
    assert select("F16", "avx512", 1, exclude("avx512", "evex")) == "avx2"   # all ruled out: the family below
    zen4 = ZEN4._replace(prefer=frozenset({"planes", "vbmi", "kz"}))   # forced where the conditions say no
    assert [select(n, "avx512", 1, zen4) for n in ("IQ2_XXS", "IQ1_S", "Q4_K")] == ["planes", "planes", "kz"]
    assert select("IQ1_M", "avx512", 1, ZEN4._replace(prefer=frozenset({"vbmi"}))) == "vbmi"


def test_this_cpu_as_detected():
    """Vendor and family as /proc/cpuinfo tells them; AMD family 19h (Zen 4) splits 512-bit operations."""
    info = Path("/proc/cpuinfo")
    if not info.exists():
        pytest.skip("no /proc/cpuinfo to check against")
    fields = dict(line.split(":", 1) for line in info.read_text().splitlines()[:30] if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(fields.get("vendor_id"), "other")
    assert (HERE.vendor, HERE.family) == (vendor, int(fields.get("cpu family", "0")))
    assert native.cpu_splits_512() == (vendor == "amd" and HERE.family == 0x19)
    flags = set(fields.get("flags", "").split())
    wanted = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
    assert native.cpu_has_avx512() == (wanted <= flags and native.cpu_has_avx2()), sorted(wanted & flags)
    assert ("avx512" in HERE.features) == native.cpu_has_avx512() and ("avx2" in HERE.features) == native.cpu_has_avx2()


@pytest.mark.parametrize("t", ALL, ids=lambda t: t.name)
def test_calls_run_the_tiles_the_choice_names(t):
    """A call of each family this CPU runs: decode (1-3 tokens) and prefill (4 and more) give the bytes
    of the tile select names, and report its family (native.type_support too)."""
    rng = np.random.default_rng(int(t))
    w = random_weights(t, 21, 2048, rng)
    for impl in [f for f in ("scalar", "avx2", "avx512") if f in HERE.features or f == "scalar"]:
        for n_tok in (1, 2, 3, 4, 9):
            kind = select(t, impl, n_tok)
            x = make_tokens(n_tok, 2048, rng)
            got = native.qdot_rows(t, w, 21, 2048, x, impl=impl)
            assert bits(got) == bits(native.qdot_rows(t, w, 21, 2048, x, tile=kind)), (t.name, impl, n_tok, kind)
            assert kernel_family(t, impl, n_tok < 4) == TILE_KINDS[kind].family
    support = native.type_support(t)
    assert (support.decode_runs, support.runs) == (kernel_family(t, native.default_impl(), True),
                                                   kernel_family(t, native.default_impl(), False))


def test_families_with_tiles_of_their_own():
    own = {f: {r.name for r in TYPES if native.has_qdot_kernel(r.name, f)} for f in ("scalar", "avx2", "avx512")}
    assert own["scalar"] == own["avx2"] == {r.name for r in TYPES}
    assert own["avx512"] == {"F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "Q2_K", "Q3_K", "Q4_K",
                             "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "TQ1_0", *GRID}


# ---- STRATA_KERNEL, read once per process: children ----

def child_env(**env: str) -> dict[str, str]:
    """This environment for a child Python, less the kernel overrides, with the repository ahead of
    whatever PYTHONPATH already holds (where the packages live in a --target folder, the child needs both)."""
    full = {k: v for k, v in os.environ.items() if k != "STRATA_KERNEL"}
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full.get("PYTHONPATH")]))
    full.update(env)
    return full


def run_child(code: str, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env(**env), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{env}: {done.stderr[-3000:]}"
    return done.stdout


def test_strata_kernel_is_read_into_the_description():
    code = ("import json; from strata.native.qdot import cpu, kernel_family as f; from strata.native._lib import lib; "
            "d = cpu(); print(json.dumps([sorted(d.prefer), sorted(d.exclude), sorted(d.features), "
            "lib.strata_kernel_cap(), f('Q4_K', 'avx512', True) if 'avx512' in d.features else '-']))")
    out = json.loads(run_child(code, STRATA_KERNEL="avx2, +avx512 -planes,-vbmi  -avx_vnni +ymm_gathers -fast_gathers"))
    assert out == [["avx512"], ["planes", "vbmi"], sorted(HERE.features - {"avx_vnni", "fast_gathers"} | {"ymm_gathers"}),
                   lib.STRATA_IMPL_AVX2, "avx512" if "avx512" in HERE.features else "-"]
    assert json.loads(run_child(code))[:2] == [[], []] and json.loads(run_child(code))[3] == 0
    bad = subprocess.run([sys.executable, "-c", "from strata.native.qdot import cpu; cpu()"], cwd=ROOT,
                         env=child_env(STRATA_KERNEL="+avx1024"), capture_output=True, text=True)
    assert bad.returncode != 0 and "STRATA_KERNEL" in bad.stderr


def default_impl_with(**env: str) -> str:
    return run_child("from strata import native; print(native.default_impl())", **env).strip()


def test_default_impl_follows_detection_and_overrides():
    """AUTO's family (strata_impl_default, native/formats/dequant.c): the widest the CPU runs, capped by
    STRATA_KERNEL's scalar|avx2|avx512 word (strata_kernel_cap; the last such word counts)."""
    widest = "avx512" if native.cpu_has_avx512() else "avx2" if native.cpu_has_avx2() else "scalar"
    capped = "avx2" if native.cpu_has_avx2() else "scalar"
    assert native.default_impl() in native.IMPLS
    assert default_impl_with() == widest
    assert default_impl_with(STRATA_KERNEL="") == widest
    assert default_impl_with(STRATA_KERNEL="avx512 -planes") == widest
    assert default_impl_with(STRATA_KERNEL="avx2") == capped
    assert default_impl_with(STRATA_KERNEL="scalar") == "scalar"
    assert default_impl_with(STRATA_KERNEL="avx2 scalar") == "scalar"


GATHER_CHILD = r"""
import sys
import numpy as np
from strata import native
from strata.native.qdot import cpu
from strata.quant import GGMLType as T
from tests.native.qdot_cases import assert_close_to_scalar, make_tokens, random_weights

assert ("ymm_gathers" in cpu().features) == (sys.argv[1] == "1")
impls = ["avx2"] + (["avx512"] if native.cpu_has_avx512() else [])
rng = np.random.default_rng(5)
out = []
for t in (T.IQ2_XXS, T.IQ3_XXS, T.IQ2_XS, T.IQ3_S, T.IQ2_S, T.IQ1_S, T.IQ1_M):
    for n_rows, n_blocks in ((1, 1), (7, 3), (5, 9)):
        w = random_weights(t, n_rows, 256 * n_blocks, rng)
        for n_tok in (1, 2, 3, 4, 5, 8, 17, 40):
            x = make_tokens(n_tok, 256 * n_blocks, rng)
            for impl in impls:
                out.append(native.qdot_rows(t, w, n_rows, 256 * n_blocks, x, impl=impl))
                assert_close_to_scalar(t, w, x, native.qdot.select(t, impl, n_tok), f"gathers {sys.argv[1]} {impl}")
            out.append(native.qdot_rows(t, w, n_rows, 256 * n_blocks, x, tile="avx2"))
np.save(sys.argv[2], np.concatenate([o.ravel() for o in out]))
"""


@pytest.mark.skipif("avx2" not in HERE.features, reason="CPU has no AVX2/FMA/F16C")
def test_gathered_grid_rows_give_the_same_bits_as_scalar_loads(tmp_path):
    """The grid i-quants' AVX2 chunks (the AVX2 and AVX-VNNI tiles, the prefill over unpacked rows and
    the VNNI tiles that unpack with the same chunks) fetch grid rows by ymm gathers or scalar loads,
    one choice per process (STRATA_KERNEL=+ymm_gathers or -ymm_gathers): the same bytes either way."""
    results = []
    for sign in "+-":
        path = tmp_path / f"gathers{sign}.npy"
        run_child(GATHER_CHILD.replace("sys.argv[1]", repr("1" if sign == "+" else "0")).replace(
            "sys.argv[2]", repr(str(path))), STRATA_KERNEL=f"{sign}ymm_gathers")
        results.append(np.load(path))
    assert results[0].size > 0 and bits(results[0]) == bits(results[1])
