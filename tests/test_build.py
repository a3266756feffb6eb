"""The native build: CPU dispatch, the scalar override, and the missing-compiler message."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_kernel_scalar_env_selects_scalar_path():
    code = "from strata import native; print(native.default_impl())"
    env = dict(os.environ, STRATA_KERNEL="scalar")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "scalar"
    env["STRATA_KERNEL"] = ""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    from strata import native
    widest = "avx512" if native.cpu_has_avx512() else "avx2" if native.cpu_has_avx2() else "scalar"
    assert out.stdout.strip() == widest


def test_avx2_request_on_unsupported_cpu_is_refused_or_runs():
    import numpy as np

    from strata import native
    from strata.errors import NativeError

    src = np.zeros(34, dtype=np.uint8)
    out = np.empty((1, 32), dtype=np.float32)
    if native.cpu_has_avx2():
        native.dequantize_into("q8_0", src, out, impl="avx2")
        assert not out.any()
    else:
        with pytest.raises(NativeError, match="not available on this CPU"):
            native.dequantize_into("q8_0", src, out, impl="avx2")


def test_missing_compiler_names_what_to_install():
    env = dict(os.environ, CC="strata-no-such-compiler")
    env.pop("STRATA_SKIP_COMPILER_CHECK", None)
    out = subprocess.run([sys.executable, str(ROOT / "build.py"), "--check-only"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert out.returncode != 0
    assert "no C compiler found" in out.stderr
    assert "strata-no-such-compiler" in out.stderr
    assert "build-essential" in out.stderr


# Sources that enable AVX-VNNI (#pragma GCC target("avxvnni"), VEX-encoded VPDPBUSD / VPDPWSSD), and
# the one that says whether the CPU may run them.
AVX_VNNI_SOURCES = ("qdot_tq1_avxvnni.c", "qdot_iq_avxvnni.c", "dequant.c")


def _our_lines(preprocessed: str) -> list[str]:
    """The lines of `cc -E` output that come from the repository's native/ folder (not system headers,
    whose immintrin.h enables every ISA it declares)."""
    ours, out = False, []
    for line in preprocessed.splitlines():
        if line.startswith("# "):
            parts = line.split('"')
            ours = len(parts) > 1 and "/native/" in parts[1].replace("\\", "/")
            continue
        if ours:
            out.append(line)
    return out


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "i686"), reason="x86 sources")
def test_a_compiler_without_avx_vnni_builds_without_it(tmp_path):
    """GCC before 11 and clang before 12 do not know the avxvnni target: with STRATA_CC_AVX_VNNI=0 (what
    common.h defines for them) the AVX-VNNI sources ask for no such target and use no such instruction,
    still compile and define the kernels' names, and strata_cpu_avx_vnni's detection is left out."""
    import shutil
    import sysconfig

    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler {cc!r}")
    native = ROOT / "native"
    path = {p.name: p for p in native.rglob("*.c")}
    includes = [f"-I{d}" for d in {p.parent for p in native.rglob("*.h")}]
    for name in AVX_VNNI_SOURCES:
        for macro, want in (("0", False), ("1", name != "dequant.c")):
            pre = subprocess.run([cc, "-E", f"-DSTRATA_CC_AVX_VNNI={macro}", "-D_GNU_SOURCE", "-std=c11", *includes,
                                  str(path[name])], capture_output=True, text=True, check=True).stdout
            lines = _our_lines(pre)
            assert lines, name
            uses = any("avxvnni" in line and "target" in line or "_avx_epi32" in line for line in lines)
            assert uses == want, f"{name} with STRATA_CC_AVX_VNNI={macro}: AVX-VNNI used {uses}"
        obj = tmp_path / (name + ".o")
        subprocess.run([cc, "-c", "-O1", "-std=c11", "-D_GNU_SOURCE", "-DSTRATA_CC_AVX_VNNI=0", *includes, str(path[name]),
                        "-o", str(obj)], check=True, capture_output=True)
    names = subprocess.run(["nm", str(tmp_path / "qdot_iq_avxvnni.c.o")], capture_output=True, text=True).stdout
    for t in ("iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"):
        assert f"strata_qdot_{t}_avxvnni" in names
