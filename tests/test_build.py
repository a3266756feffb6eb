"""The native build: CPU dispatch, the scalar override, and the missing-compiler message."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_force_scalar_env_selects_scalar_path():
    code = "from strata import native; print(native.default_impl())"
    env = dict(os.environ, STRATA_FORCE_SCALAR="1")
    env.pop("STRATA_FORCE_AVX2", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "scalar"
    env["STRATA_FORCE_SCALAR"] = "0"
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
