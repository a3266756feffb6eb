"""Native quantizers (native/quantize.c) against gguf-py and against simple reference quantizers.

Q8_0 must be byte-identical to gguf.quants. Q4_K/Q6_K have no quantizer in gguf-py: their bytes are
checked by dequantizing with gguf.quants (the bit-level truth for the format) and comparing the
round-trip error with (a) the error the format is known to give and (b) a plain min/max quantizer
of the same format, which the search must never do worse than.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import gguf.quants
from gguf import GGMLQuantizationType as T

from strata import native
from strata.errors import NativeError

ROOT = Path(__file__).resolve().parents[2]

K_TYPES = [T.Q4_K, T.Q6_K]
#: Types with an AVX2 scale search (Q2_K: the miss stand-ins' type, not a converter type).
AVX2_TYPES = [*K_TYPES, T.Q2_K]


def _rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(a, dtype=np.float64))))


def _roundtrip(t: T, x: np.ndarray, n_threads: int = 1) -> np.ndarray:
    packed = native.quantize(t, x, n_threads=n_threads)
    return gguf.quants.dequantize(packed, t).reshape(x.shape)


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, a / np.where(b != 0, b, 1), 0).astype(np.float32)


def _minmax_q4_k(x: np.ndarray) -> np.ndarray:
    """Q4_K values of a plain quantizer: each sub-block of 32 on its own min..max grid."""
    xb = x.reshape(-1, 8, 32)
    lo = np.minimum(xb.min(-1), 0)                            # [B, 8]
    sc, mn = (xb.max(-1) - lo) / 15, -lo
    d, dmin = _f16(sc.max(1, keepdims=True) / 63), _f16(mn.max(1, keepdims=True) / 63)
    ls, lm = np.clip(np.rint(_div(sc, d)), 0, 63), np.clip(np.rint(_div(mn, dmin)), 0, 63)
    q = np.clip(np.rint(_div(xb + (dmin * lm)[..., None], (d * ls)[..., None])), 0, 15)
    return ((d * ls)[..., None] * q - (dmin * lm)[..., None]).reshape(x.shape)


def _absmax_q6_k(x: np.ndarray) -> np.ndarray:
    """Q6_K values of a plain quantizer: each sub-block of 16 scaled by its max |x| / 31."""
    xb = x.reshape(-1, 16, 16)
    sc = np.abs(xb).max(-1) / 31                              # [B, 16]
    d = _f16(sc.max(1, keepdims=True) / 127)
    ls = np.clip(np.rint(_div(sc, d)), 0, 127)
    q = np.clip(np.rint(_div(xb, (d * ls)[..., None])), -32, 31)
    return ((d * ls)[..., None] * q).reshape(x.shape)


PLAIN = {T.Q4_K: _minmax_q4_k, T.Q6_K: _absmax_q6_k}
# Round-trip RMS error of the format on unit Gaussian data (llama.cpp's reference quantizer gives
# 0.072 and 0.019 on this data; the bounds leave a little room).
GAUSS_RMS_BOUND = {T.Q4_K: 0.075, T.Q6_K: 0.020}


@pytest.fixture(scope="module")
def gauss() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((37, 1024)).astype(np.float32)


# ---- Q8_0: byte-identical to gguf-py ----

def test_q8_0_matches_gguf_py(gauss):
    rng = np.random.default_rng(1)
    x = np.concatenate([gauss, rng.standard_normal((3, 1024)).astype(np.float32) * np.float32(1e-6),
                        rng.standard_normal((3, 1024)).astype(np.float32) * np.float32(3e4),
                        np.zeros((2, 1024), np.float32)])
    x[0, 5] = 65000.0  # scale that only just fits in half precision
    x[1, :32] = np.float32(1e-30)  # block scale that underflows half precision
    for n_threads in (1, 3):
        assert np.array_equal(native.quantize(T.Q8_0, x, n_threads=n_threads), gguf.quants.quantize(x, T.Q8_0))


def test_q8_0_accepts_torch(gauss):
    assert np.array_equal(native.quantize(T.Q8_0, torch.from_numpy(gauss)), gguf.quants.quantize(gauss, T.Q8_0))


# ---- K-quants: round-trip error ----

@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_k_quant_gaussian_error(t, gauss):
    ours = _rms(_roundtrip(t, gauss) - gauss)
    plain = _rms(PLAIN[t](gauss) - gauss)
    assert ours < GAUSS_RMS_BOUND[t]
    assert ours <= plain, f"{t.name}: search error {ours} worse than plain quantizer {plain}"


@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_k_quant_not_worse_than_plain_on_skewed_data(t):
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.exponential(1.0, (8, 512)), rng.standard_t(3, (8, 512)),
                        rng.uniform(-1, 3, (8, 512))]).astype(np.float32)
    assert _rms(_roundtrip(t, x) - x) <= _rms(PLAIN[t](x) - x)


@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_k_quant_zero_rows(t):
    x = np.zeros((3, 512), np.float32)
    assert np.array_equal(_roundtrip(t, x), x)


@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("c", [1.0, -0.37, 0.05, 250.0])
def test_k_quant_constant_rows(t, c):
    # (Blocks whose values are all below ~1e-3 lose relative precision in either format: the
    # super-block scale is a half-precision number and becomes subnormal. That is the format.)
    x = np.full((2, 512), c, np.float32)
    assert np.allclose(_roundtrip(t, x), x, rtol=2e-3, atol=0)


@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_k_quant_huge_outlier(t, gauss):
    x = gauss[:4].copy()
    x[1, 300] = 1e4
    y = _roundtrip(t, x)
    # The outlier itself survives to the format's relative precision...
    assert abs(y[1, 300] - 1e4) < 1e4 * 0.02
    # ...and only its own 256-value block pays for it; every other block is unaffected.
    others = np.ones(x.shape, bool)
    others[1, 256:512] = False
    assert _rms((y - x)[others]) < GAUSS_RMS_BOUND[t]
    # Inside the outlier's block the error is bounded by the outlier's scale.
    assert _rms((y - x)[1, 256:512]) <= _rms(PLAIN[t](x)[1, 256:512] - x[1, 256:512]) * 1.01


@pytest.mark.parametrize("t", [T.Q8_0, *K_TYPES], ids=lambda t: t.name)
def test_threads_do_not_change_bytes(t):
    x = np.random.default_rng(3).standard_normal((7, 512)).astype(np.float32)
    one = native.quantize(t, x, n_threads=1)
    for n in (2, 3, 8, 64):
        assert np.array_equal(native.quantize(t, x, n_threads=n), one)


# ---- Wrapper checks ----

def test_wrapper_rejects_bad_inputs(gauss):
    with pytest.raises(ValueError, match="float32"):
        native.quantize(T.Q8_0, gauss.astype(np.float64))
    with pytest.raises(ValueError, match="contiguous"):
        native.quantize(T.Q8_0, gauss[:, ::2])
    with pytest.raises(ValueError, match="multiple of the block size 256"):
        native.quantize(T.Q4_K, gauss[:, :288].copy())
    with pytest.raises(ValueError, match="not supported"):
        native.quantize(T.Q5_K, gauss)
    with pytest.raises(ValueError, match="output holds"):
        native.quantize_into(T.Q4_K, gauss, np.empty(10, np.uint8))
    with pytest.raises(ValueError, match="positive"):
        native.quantize(T.Q4_K, gauss, n_threads=0)
    with pytest.raises(TypeError):
        native.quantize(T.Q4_K, [1.0] * 256)


def test_c_size_checks_back_the_wrapper():
    """The C entry point checks sizes itself, whatever the Python side passes."""
    from strata._native import ffi, lib
    src = np.zeros(512, np.float32)
    dst = np.zeros(144, np.uint8)
    call = lambda rows, src_bytes, dst_bytes, row_len=256: lib.strata_quantize(
        int(T.Q4_K), ffi.cast("const float *", ffi.from_buffer(src)), src_bytes, ffi.from_buffer(dst), dst_bytes,
        rows, row_len, 1, lib.STRATA_IMPL_SCALAR)
    assert call(1, 1024, 144) == lib.STRATA_OK
    assert call(2, 2048, 144) == lib.STRATA_E_SIZE       # output too small for 2 rows
    assert call(2, 1024, 288) == lib.STRATA_E_SIZE       # source too small for 2 rows
    assert call(1, 1024, 144, row_len=100) == lib.STRATA_E_BLOCK
    assert call(-1, 1024, 144) == lib.STRATA_E_ARG
    assert call(1 << 62, 1024, 144) == lib.STRATA_E_SIZE  # overflowing product
    assert lib.strata_quantize(int(T.Q5_K), ffi.NULL, 0, ffi.NULL, 0, 0, 0, 1, 0) == lib.STRATA_E_TYPE
    assert call(1, 1024, 144) == lib.STRATA_OK
    assert lib.strata_quantize(int(T.Q4_K), ffi.cast("const float *", ffi.from_buffer(src)), 1024,
                               ffi.from_buffer(dst), 144, 1, 256, 1, 99) == lib.STRATA_E_ARG


def test_error_status_becomes_native_error(monkeypatch, gauss):
    monkeypatch.setattr(native.quantizer, "can_quantize", lambda t: True)  # the wrapper's own lookup
    with pytest.raises(NativeError, match="unsupported ggml type"):
        native.quantize_into(T.Q5_K, gauss, np.empty(1 << 20, np.uint8))


# ---- AVX2 twins of the K-quant searches: equal to the scalar code, bit for bit ----

@pytest.mark.skipif(not native.cpu_has_avx2(), reason="CPU without AVX2")
@pytest.mark.parametrize("t", AVX2_TYPES, ids=lambda t: t.name)
def test_avx2_search_equals_scalar(t):
    rng = np.random.default_rng(5)
    parts = [rng.standard_normal((24, 1024)), rng.exponential(1.0, (8, 1024)), -rng.exponential(1.0, (8, 1024)),
             rng.standard_t(2, (8, 1024)), rng.uniform(0, 1, (8, 1024)) ** 8, np.zeros((2, 1024)),
             np.full((2, 1024), -0.3), np.full((2, 1024), 7.0), rng.standard_normal((4, 1024)) * 1e-6]
    x = np.concatenate(parts).astype(np.float32)
    x[0, :48] = 0.0             # zero sub-blocks inside a live block
    x[1, 300] = 1e4             # one outlier
    x[2, 16:32] = -2.5          # a flat negative sub-block
    x[3, ::2] = 0.0
    assert np.array_equal(native.quantize(t, x, impl="avx2"), native.quantize(t, x, impl="scalar"))


def test_kernel_scalar_env():
    """STRATA_KERNEL=scalar (read once per process, so in a child): AUTO quantizes as the scalar kernel."""
    code = ("import numpy as np; from gguf import GGMLQuantizationType as T; from strata import native; "
            "x = np.random.default_rng(0).standard_normal((37, 1024)).astype(np.float32); "
            "print(native.default_impl(), np.array_equal(native.quantize(T.Q4_K, x), "
            "native.quantize(T.Q4_K, x, impl='scalar')))")
    env = dict(os.environ, STRATA_KERNEL="scalar")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["scalar", "True"]
