"""GPTQ (converters.calib.gptq): on correlated activations with outlier channels, the output error
||X W^T - X Q^T|| is well below round-to-nearest's and the importance-weighted search's, and the
packed bytes are an ordinary GGML tensor that gguf-py dequantizes."""
import gguf.quants
import numpy as np
import pytest

from converters.calib.gptq import gptq_quantize
from strata import native
from strata.native import calib


def _activations(rng, n, k):
    mix = rng.standard_normal((k, k)) / np.sqrt(k)
    x = rng.standard_normal((n, k)) @ (np.eye(k) + 0.7 * mix)  # correlated channels
    x[:, rng.choice(k, k // 16, replace=False)] *= 8.0  # outlier channels
    return x.astype(np.float32)


def _out_err(t, packed, W, X):
    Q = gguf.quants.dequantize(packed, gguf.GGMLQuantizationType[t]).reshape(W.shape)
    return float(np.linalg.norm(X @ (W - Q).T))


@pytest.mark.parametrize("t", ["Q4_K", "Q8_0", "Q6_K"])
def test_gptq_beats_rtn_on_output_error(t):
    rng = np.random.default_rng(0)
    N, K = 64, 512
    W = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
    X = _activations(rng, 2048, K)
    H = X.T.astype(np.float64) @ X
    rtn = native.quantize(t, W)
    wtd = calib.quantize_weighted(t, W, np.diag(H).astype(np.float32))
    g = gptq_quantize(W, H, t, n_threads=2)
    assert g.shape == rtn.shape and g.dtype == np.uint8
    e_rtn, e_w, e_g = _out_err(t, rtn, W, X), _out_err(t, wtd, W, X), _out_err(t, g, W, X)
    assert e_w < e_rtn
    assert e_g < 0.8 * e_rtn, (e_g, e_w, e_rtn)
    assert e_g < e_w


def test_gptq_refuses_bad_shapes():
    with pytest.raises(ValueError, match="whole blocks"):
        gptq_quantize(np.zeros((4, 100), np.float32), np.eye(100), "Q8_0")
    with pytest.raises(ValueError, match="Hessian"):
        gptq_quantize(np.zeros((4, 256), np.float32), np.eye(128), "Q4_K")


def test_native_block_matches_torch_reference():
    import torch

    from converters.calib.gptq import quantize_block_ref
    rng = np.random.default_rng(3)
    N, B = 8, 256
    W = torch.from_numpy(rng.standard_normal((N, 2 * B)).astype(np.float32))
    U = torch.from_numpy(np.triu(rng.uniform(0.1, 1, (B, B))).astype(np.float32)) + torch.eye(B)
    step = torch.from_numpy(rng.uniform(0.01, 0.2, (N, B)).astype(np.float32))
    step[0, :7] = 0  # a zero-scale sub-block: code 0
    zero = torch.from_numpy(-8 * step.numpy())
    ref_codes, ref_err = quantize_block_ref(W[:, :B], U, step, zero, 15)
    view = W[:, :B]  # a strided view, as in gptq_quantize
    codes, err = calib.gptq_block(view, U, step, zero, 15, n_threads=2)
    assert torch.equal(codes, ref_codes) and torch.equal(err, ref_err)
    assert codes[0, :7].eq(0).all() and codes.max() <= 15 and codes.min() >= 0
