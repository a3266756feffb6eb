"""Q4_K / Q6_K bytes against llama.cpp's own reference quantizer (the libggml that
llama-cpp-python ships), called through ctypes."""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from strata import native

pytestmark = pytest.mark.interop
llama_cpp = pytest.importorskip("llama_cpp")


def _ggml_ref(name: str):
    libdir = Path(llama_cpp.__file__).parent / "lib"
    candidates = sorted(libdir.glob("libggml-base.so*")) or sorted(libdir.glob("libggml.so*"))
    if not candidates:
        pytest.skip(f"no libggml-base in {libdir}")
    fn = getattr(ctypes.CDLL(str(candidates[0])), name)
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    return fn


@pytest.mark.parametrize("impl", ["scalar", "auto"])
@pytest.mark.parametrize("t,fn", [(T.Q4_K, "quantize_row_q4_K_ref"), (T.Q6_K, "quantize_row_q6_K_ref")],
                         ids=["Q4_K", "Q6_K"])
def test_k_quants_match_llama_cpp_reference(t, fn, impl):
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.standard_normal((16, 1024)), rng.exponential(0.02, (4, 1024)),
                        np.zeros((1, 1024)), np.full((1, 1024), -0.3)]).astype(np.float32)
    x[2, 17] = 1e4
    ours = native.quantize(t, x, n_threads=2, impl=impl)
    ref = np.empty_like(ours)
    _ggml_ref(fn)(x.ctypes.data, ref.ctypes.data, x.size)
    assert np.array_equal(ours, ref)
