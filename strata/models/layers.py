"""Small shared layers: RMSNorm, the SwiGLU feed-forward (dense FFN and shared expert) and
`linear`, the one product every weight goes through (a float tensor, or a `PackedMatrix` that
computes from the file's blocks).
Must not: read files or choose the compute path (the loader hands each layer its weights).
"""
from __future__ import annotations

from functools import singledispatch
from typing import Union

import torch
import torch.nn.functional as F
from torch import nn

from .packed import PackedMatrix


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dimension, the mean of squares taken in float32."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight, self.eps = weight, eps  # [N]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


Weight = Union[torch.Tensor, PackedMatrix]


def linear(x: torch.Tensor, w: Weight, b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w^T (+ b) for x [T, K] and w [N, K], by the weight's form: torch for a float tensor, the
    native quantized kernels for a `PackedMatrix` (one registered `product` per form)."""
    return product(w, x, b)


@singledispatch
def product(w, x: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """A weight that computes its own product (`PackedMatrix`, calibration's recording wrapper)."""
    y = w(x)  # [T, N]
    return y if b is None else y + b


@product.register
def _(w: torch.Tensor, x: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, w, b)


@singledispatch
def embed(w: Weight, tokens: torch.Tensor) -> torch.Tensor:
    """Rows `tokens` [T] of the embedding w [V, D], by the weight's form."""
    raise TypeError(f"no embedding for a weight of type {type(w).__name__}")


@embed.register
def _(w: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return F.embedding(tokens, w)


@embed.register
def _(w: PackedMatrix, tokens: torch.Tensor) -> torch.Tensor:
    return w.rows(tokens)


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

    def __init__(self, ffn: FeedForward, gate_inp: torch.Tensor | None):
        super().__init__()
        self.ffn, self.gate_inp = ffn, gate_inp  # gate_inp [D]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.ffn(x)  # [T, D]
        if self.gate_inp is None:
            return out
        return torch.sigmoid(x @ self.gate_inp)[:, None] * out  # [T, 1] * [T, D]


__all__ = ["FeedForward", "RMSNorm", "SharedExpert", "Weight", "embed", "linear", "swiglu"]
