"""Small shared layers: RMSNorm, the SwiGLU feed-forward (dense FFN and shared expert) and
`linear`, the one product every weight goes through (a float tensor, or a `PackedMatrix` that
computes from the file's blocks).
Must not: read files or choose the compute path (the loader hands each layer its weights).
"""
from __future__ import annotations

from typing import Union

import torch
import torch.nn.functional as F
from torch import nn

from strata import native

from .packed import PackedMatrix


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dimension, the mean of squares taken in float32."""

    def __init__(self, weight: torch.Tensor, eps: float, native: bool = False):
        super().__init__()
        self.weight, self.eps = weight, eps  # [N]
        self.native = native  # float32 on the CPU (packed compute): one native call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native:
            return native.rmsnorm(x, self.weight, self.eps, torch.empty(x.shape, dtype=torch.float32))
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


Weight = Union[torch.Tensor, PackedMatrix]


def linear(x: torch.Tensor, w: Weight, b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w^T (+ b) for x [T, K] and w [N, K]: torch for float weights, the native quantized
    kernels for packed ones."""
    if isinstance(w, torch.Tensor):
        return F.linear(x, w, b)
    y = w(x)  # [T, N]
    return y if b is None else y + b


def swiglu(x: torch.Tensor, gate: Weight, up: Weight, down: Weight) -> torch.Tensor:
    """down @ (silu(gate @ x) * (up @ x)) for rows x [T, D]; gate, up [I, D], down [D, I]."""
    return linear(F.silu(linear(x, gate)) * linear(x, up), down)  # [T, D]


class FeedForward(nn.Module):
    """A dense SwiGLU feed-forward: the FFN of a dense layer."""

    def __init__(self, gate: Weight, up: Weight, down: Weight):
        super().__init__()
        self.gate, self.up, self.down = gate, up, down  # [I, D], [I, D], [D, I]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.gate, self.up, self.down)  # [T, D]


class SharedExpert(nn.Module):
    """An always-on expert added to the routed ones, scaled per token by sigmoid(gate_inp . x)
    when the model has that gate (Qwen2-MoE), else added as is."""

    def __init__(self, ffn: FeedForward, gate_inp: torch.Tensor | None, compute=None):
        super().__init__()
        self.ffn, self.gate_inp = ffn, gate_inp  # gate_inp [D]
        # packed compute (`compute`, a PackedCompute) with three packed matrices: (MoeParts holding
        # the expert, PackedCompute, gate), the expert run as a one-expert fused MoE call
        self.packed = None
        if compute is not None and all(isinstance(m, PackedMatrix) for m in (ffn.gate, ffn.up, ffn.down)):
            self._pack(compute)

    def _pack(self, compute) -> None:
        """Run the expert as a one-expert fused MoE call (the decode program's own form, so every
        path gives the same bytes)."""
        mats = (self.ffn.gate, self.ffn.up, self.ffn.down)
        parts = native.MoeParts(*(native.MoePart(m._data_t, m.type, *m.shape) for m in mats))
        T = compute.max_tokens
        compute.reserve(native.moe_scratch_bytes(parts, T, T))
        gate = None if self.gate_inp is None else self.gate_inp.float().contiguous()
        self.packed = (parts, compute, gate)
        self._bufs = (torch.zeros(1, dtype=torch.int32), torch.empty(2, dtype=torch.int64),
                      torch.arange(T, dtype=torch.int32), torch.empty(T, dtype=torch.float32))

    def add_packed(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out [T, D] float32 += this expert of x [T, D] float32 (contiguous), weighted per token."""
        parts, c, gate = self.packed
        index, offsets, tokens, weights = self._bufs
        step = c.max_tokens
        for t0 in range(0, x.shape[0], step):
            xs, n = x[t0:t0 + step], min(step, x.shape[0] - t0)
            native.shared_weights(xs, gate, weights[:n])
            offsets[0], offsets[1] = 0, n
            native.moe_swiglu(c.pool, xs, out[t0:t0 + n], parts, index, offsets, tokens[:n], weights[:n], c.scratch)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            x = x.float().contiguous()
            return self.add_packed(x, torch.zeros(x.shape, dtype=torch.float32))
        out = self.ffn(x)  # [T, D]
        if self.gate_inp is None:
            return out
        return torch.sigmoid(x @ self.gate_inp)[:, None] * out  # [T, 1] * [T, D]


__all__ = ["FeedForward", "RMSNorm", "SharedExpert", "Weight", "linear", "swiglu"]
