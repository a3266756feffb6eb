"""Small shared layers: RMSNorm and the SwiGLU feed-forward (dense FFN and shared expert)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dimension, the mean of squares taken in float32."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight, self.eps = weight, eps  # [N]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """down @ (silu(gate @ x) * (up @ x)) for rows x [T, D]; gate, up [I, D], down [D, I]."""
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)  # [T, D]


class FeedForward(nn.Module):
    """A dense SwiGLU feed-forward: the FFN of a dense layer."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor):
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


__all__ = ["FeedForward", "RMSNorm", "SharedExpert", "swiglu"]
