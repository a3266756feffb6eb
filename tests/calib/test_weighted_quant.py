"""Importance-weighted quantization (native/calib.c): never worse than round-to-nearest on the
weighted error, clearly better with skewed importances, readable by gguf-py, and the GPTQ grid
(`grid`, `set_codes`) reproduces the blocks."""
import gguf.quants
import numpy as np
import pytest

from strata import native
from strata.native import calib

TYPES = ["Q8_0", "Q4_K", "Q6_K"]


def _weighted_err(t, packed, x, imp):
    deq = gguf.quants.dequantize(packed, gguf.GGMLQuantizationType[t]).reshape(x.shape)
    return float((imp[None, :] * (deq - x) ** 2).sum())


@pytest.mark.parametrize("t", TYPES)
def test_weighted_beats_rtn_on_skewed_importance(t):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    x[:, ::37] *= 6.0  # outlier columns, as real activations have
    imp = np.exp(rng.standard_normal(512) * 2.0).astype(np.float32)  # skewed importances
    rtn = native.quantize(t, x)
    w = calib.quantize_weighted(t, x, imp, n_threads=2)
    assert w.shape == rtn.shape
    e_rtn, e_w = _weighted_err(t, rtn, x, imp), _weighted_err(t, w, x, imp)
    assert e_w <= e_rtn
    assert e_w < 0.9 * e_rtn, (e_w, e_rtn)  # a real gain, not a tie


@pytest.mark.parametrize("t", TYPES)
def test_uniform_importance_never_worse_per_row(t):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((16, 256)) * rng.uniform(0.01, 3, (16, 1))).astype(np.float32)
    imp = np.ones(256, np.float32)
    rtn, w = native.quantize(t, x), calib.quantize_weighted(t, x, imp)
    for r in range(16):
        assert _weighted_err(t, w[r:r + 1], x[r:r + 1], imp) <= _weighted_err(t, rtn[r:r + 1], x[r:r + 1], imp) * (1 + 1e-6)


@pytest.mark.parametrize("t", TYPES)
def test_grid_and_set_codes_round_trip(t):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    packed = calib.quantize_weighted(t, x, np.ones(256, np.float32))
    step, zero = calib.grid(t, packed, x.size)
    deq = gguf.quants.dequantize(packed, gguf.GGMLQuantizationType[t]).reshape(-1)
    codes = np.where(step != 0, np.round((deq - zero) / np.where(step != 0, step, 1)), 0)  # Q6_K steps may be negative
    assert codes.min() >= 0 and codes.max() <= calib.code_max(t)
    np.testing.assert_allclose(zero + step * codes, deq, rtol=0, atol=1e-5 * np.abs(deq).max())
    again = calib.set_codes(t, codes.astype(np.float32), np.zeros_like(packed) + packed)
    assert np.array_equal(again, packed)
    # other codes land where the grid says
    rnd = rng.integers(0, calib.code_max(t) + 1, x.size).astype(np.float32)
    moved = calib.set_codes(t, rnd, packed.copy())
    deq2 = gguf.quants.dequantize(moved, gguf.GGMLQuantizationType[t]).reshape(-1)
    np.testing.assert_allclose(deq2, zero + step * rnd, rtol=1e-6, atol=1e-6)


def test_bad_importances_are_refused():
    x = np.zeros((1, 256), np.float32)
    with pytest.raises(ValueError, match="importances"):
        calib.quantize_weighted("Q4_K", x, np.ones(128, np.float32))
    with pytest.raises(ValueError, match="non-negative"):
        calib.quantize_weighted("Q4_K", x, -np.ones(256, np.float32))
    with pytest.raises(ValueError, match="not supported"):
        calib.quantize_weighted("Q4_0", x[:, :32], np.ones(32, np.float32))
