"""The benchmarks' llama.cpp helpers: the AMX denial (benchmarks/llama_amx.py) refuses exactly the AMX
permission request and nothing else; the kernel comparison (benchmarks/qdot_vs_ggml.py) computes the
same product as Strata through ggml's own graph."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent("""
    import ctypes, sys
    sys.path.insert(0, sys.argv[1])
    from benchmarks.llama_amx import ARCH_REQ_XCOMP_PERM, deny_amx
    libc = ctypes.CDLL(None, use_errno=True)
    denied = deny_amx()
    request = libc.syscall(158, ARCH_REQ_XCOMP_PERM, 18)  # XFEATURE_XTILEDATA
    errno = ctypes.get_errno()
    other = libc.syscall(158, 0x1003, ctypes.byref(ctypes.c_ulong()))  # ARCH_GET_FS: still allowed
    print(denied, request, errno, other)
""")


def test_amx_request_refused_and_nothing_else():
    from benchmarks.llama_amx import cpu_has_amx

    if not cpu_has_amx():
        pytest.skip("this CPU has no AMX: deny_amx() does nothing here")
    out = subprocess.run([sys.executable, "-c", PROBE, str(ROOT)], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "-1", "1", "0"]  # refused with EPERM; ARCH_GET_FS allowed


def test_amx_asked_for_is_left_alone(monkeypatch):
    from benchmarks import llama_amx

    monkeypatch.setattr(llama_amx, "cpu_has_amx", lambda: True)
    monkeypatch.setenv("STRATA_BENCH_LLAMA_AMX", "1")
    assert llama_amx.amx_wanted() and not llama_amx.deny_amx()  # returns before installing anything


@pytest.mark.interop
@pytest.mark.parametrize("name,repack", [("IQ2_XS", False), ("Q4_K", False), ("Q8_0", False), ("Q4_0", True),
                                         ("Q4_K", True)])
def test_kernel_comparison_computes_the_same_product(name, repack):
    """qdot_vs_ggml's two engines compute one product, llama.cpp's weights as in the file or
    repacked into interleaved rows (its CPU_REPACK buffer, --repack)."""
    pytest.importorskip("llama_cpp")
    import argparse

    import numpy as np

    from benchmarks.qdot_vs_ggml import compare, ggml_libs
    from strata import native

    a = argparse.Namespace(rows=64, k=512, alternate=1, repack=repack)
    with native.ComputePool(1) as pool:
        line = compare(ggml_libs(), pool, 1, name, 3, a, np.random.default_rng(1))
    diff = float(line.rsplit("differ by ", 1)[1].rstrip(")"))
    assert diff < 2e-3, line  # both quantize the activations to 8 bits: the same product to rounding


def test_kernel_comparison_refuses_a_type_llama_cpp_does_not_repack():
    """ggml's repacking buffer would crash on it: a one-line refusal instead, from the call and the CLI."""
    pytest.importorskip("llama_cpp")
    import argparse
    import subprocess
    import sys

    import numpy as np

    from benchmarks.qdot_vs_ggml import ROOT_DIR, compare

    a = argparse.Namespace(rows=64, k=512, alternate=1, repack=True)
    with pytest.raises(ValueError, match="does not repack IQ2_XS"):
        compare(None, None, 1, "IQ2_XS", 3, a, np.random.default_rng(1))
    done = subprocess.run([sys.executable, "benchmarks/qdot_vs_ggml.py", "--types", "Q4_0", "--rows", "60",
                           "--repack"], cwd=ROOT_DIR, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not a multiple of 8" in done.stderr, done.stderr[-500:]


def test_rounds_pool_the_runs_and_refuse_zero():
    """packed_vs_llama --rounds: each engine's children pooled (a failed child's error wins); 0 refused."""
    import subprocess
    import sys

    from benchmarks.packed_vs_llama import ROOT, merged

    runs = lambda *v: {"mean": sum(v) / len(v), "runs": list(v)}  # noqa: E731
    a = {"engine": "strata", "decode_tok_s": runs(10.0, 12.0), "prefill_tok_s": runs(50.0)}
    b = {"engine": "strata", "decode_tok_s": runs(14.0), "prefill_tok_s": runs(70.0)}
    both = merged([a, b])
    assert both["decode_tok_s"]["runs"] == [10.0, 12.0, 14.0] and both["decode_tok_s"]["mean"] == 12.0
    assert both["prefill_tok_s"]["min"] == 50.0 and both["prefill_tok_s"]["max"] == 70.0
    assert merged([a, {"engine": "strata", "error": "killed"}]) == {"engine": "strata", "error": "killed"}
    done = subprocess.run([sys.executable, "benchmarks/packed_vs_llama.py", "--rounds", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--rounds 0" in done.stderr, done.stderr[-500:]


def test_the_in_ram_report_says_when_the_avx2_family_takes_avx_vnni():
    """packed_vs_llama's ISA line: the AVX2 family with AVX-VNNI (TQ1_0's decode tile) is named as such,
    and never where the default family is another."""
    from benchmarks.packed_vs_llama_report import format_in_ram

    def report(default: str, vnni: bool) -> str:
        strata = {"isa": {"default": default, "avx_vnni": vnni,
                          "types": {"TQ1_0": {"share": 0.99, "runs": default, "decode_runs": default}}}}
        shape = {"shape": "medium@TQ1_0", "file_bytes": 523_500_000, "llama": {"isa": "AVX2 FMA"}, "strata": strata}
        r = {"threads": 2, "prompt": 64, "reps": 2, "n": 32, "strata_args": {}, "shapes": [shape]}
        return next(line for line in format_in_ram(r).splitlines() if "strata ISA" in line)

    assert "avx2 with AVX-VNNI; per type" in report("avx2", True)
    assert "avx2; per type" in report("avx2", False)
    assert "avx512; per type" in report("avx512", True)
