"""GPTQ into GGML block formats: column-by-column quantization with error compensation.

Follows Frantar et al., "GPTQ" (2022): with H = X^T X the Hessian of the layer's squared output
error, damped by `damp` x mean(diag H), the upper Cholesky factor U of H^-1 gives, for each column
j in turn, the quantization error e_j = (w_j - q_j) / U[j, j], which is spread over the columns
not yet quantized as W[:, j+1:] -= e_j U[j, j+1:]. Updates are lazy per block of columns (one
block = one GGML block of the output type: 32 values for Q8_0, 256 for Q4_K/Q6_K), so the
trailing columns are touched once per block by a matrix product.

Scales come first: at the start of each block, the block's scales and mins are chosen from the
error-compensated weights by the importance-weighted search (native/calib.c) with the Hessian's
diagonal as importances; the codes are then chosen column by column on that grid and packed into
the blocks (`strata.native.calib.set_codes`), so the output is an ordinary GGML tensor.

Must not: read files or know tensor names; float weights and a Hessian in, packed bytes out.
"""
from __future__ import annotations

import numpy as np
import torch

from strata.native import calib
from strata.quant import block_size, ggml_type, row_bytes

#: Damping added to H's diagonal, as a fraction of its mean (GPTQ's default).
DAMP = 0.01


def _inverse_cholesky(H: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of (H + damp * mean(diag H) I)^-1; dead columns (no activation) get 1."""
    H = H.double().clone()
    dead = torch.diag(H) <= 0
    H[dead, dead] = 1.0
    lam = damp * torch.mean(torch.diag(H))
    for attempt in range(6):  # raise the damping until the factorisation succeeds
        try:
            L = torch.linalg.cholesky(H + lam * torch.eye(H.shape[0], dtype=H.dtype))
            break
        except torch.linalg.LinAlgError:
            lam = lam * 10 if lam > 0 else 1e-6
    else:
        raise ValueError("GPTQ: the Hessian is not positive definite even with strong damping")
    Hinv = torch.cholesky_inverse(L)
    return torch.linalg.cholesky(Hinv, upper=True)


def gptq_quantize(W: np.ndarray, H: np.ndarray | torch.Tensor, t, *, damp: float = DAMP,
                  n_threads: int = 1) -> np.ndarray:
    """Quantize float32 W [N, K] into type `t` (Q8_0, Q4_K, Q6_K) with GPTQ for the input
    Hessian H [K, K]; returns packed uint8 [N, row bytes] (what `native.quantize` returns)."""
    t = ggml_type(t)
    N, K = W.shape
    group = block_size(t)[0]
    if K % group:
        raise ValueError(f"GPTQ {t.name}: rows of {K} values are not whole blocks of {group}")
    H = torch.as_tensor(H, dtype=torch.float64)
    if H.shape != (K, K):
        raise ValueError(f"GPTQ: Hessian of shape {tuple(H.shape)} for rows of {K} values")
    U = _inverse_cholesky(H, damp).float()  # [K, K]
    imp = torch.diag(H).clamp(min=0).float().numpy()
    cmax = calib.code_max(t)
    Wt = torch.tensor(np.ascontiguousarray(W, dtype=np.float32))  # [N, K], updated in place
    gbytes = row_bytes(t, group)
    out = np.empty((N, row_bytes(t, K)), dtype=np.uint8)
    for g0 in range(0, K, group):
        g1 = g0 + group
        packed = calib.quantize_weighted(t, Wt[:, g0:g1].contiguous().numpy(), imp[g0:g1], n_threads=n_threads)
        step, zero = (torch.from_numpy(a.reshape(N, group)) for a in calib.grid(t, packed, N * group))
        codes, err = calib.gptq_block(Wt[:, g0:g1], U[g0:g1, g0:g1], step, zero, cmax, n_threads=n_threads)
        Wt[:, g1:] -= err @ U[g0:g1, g1:]  # lazy update of the columns after the block
        out[:, g0 // group * gbytes:g1 // group * gbytes] = calib.set_codes(t, codes.numpy(), packed)
    return out


def quantize_block_ref(W: torch.Tensor, U: torch.Tensor, step: torch.Tensor, zero: torch.Tensor,
                    cmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes [N, B] and scaled errors [N, B] of one block of columns, compensating inside it: the
    torch reference of `strata.native.calib.gptq_block` (tests compare the two)."""
    W = W.clone()  # [N, B]
    N, B = W.shape
    codes, err = torch.empty((N, B)), torch.empty((N, B))
    safe = torch.where(step != 0, step, torch.ones_like(step))
    for j in range(B):
        w = W[:, j]
        c = torch.where(step[:, j] != 0, torch.round((w - zero[:, j]) / safe[:, j]).clamp(0, cmax),
                        torch.zeros_like(w))
        q = zero[:, j] + step[:, j] * c
        e = (w - q) / U[j, j]
        W[:, j + 1:] -= e[:, None] * U[j, j + 1:][None, :]
        codes[:, j], err[:, j] = c, e
    return codes, err


__all__ = ["DAMP", "gptq_quantize", "quantize_block_ref"]
