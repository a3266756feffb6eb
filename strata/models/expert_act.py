"""Routed experts that are not plain SwiGLU: gpt-oss's biased, clamped SwiGLU.

    g = gate_e x + bg_e,  u = up_e x + bu_e
    out = down_e ((clamp(u, -limit, limit) + 1) * min(g, limit) * sigmoid(alpha * min(g, limit))) + bd_e

(llama.cpp's `swiglu_oai`, transformers' GptOssExperts). The native fused MoE call computes plain
SwiGLU only, so these experts run one product at a time through `linear`, on float weights or on
the packed bytes of held experts (`packed_expert`), never through that call.
Must not: reach expert bytes other than those the memory handed out.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from .layers import Weight, linear
from .packed import PackedCompute, PackedMatrix


class ClampedSwiGLU:
    """Expert e's FFN with its biases: call with rows x [Te, D] and that expert's matrices."""

    def __init__(self, b_gate: torch.Tensor, b_up: torch.Tensor, b_down: torch.Tensor, alpha: float, limit: float):
        self.b_gate, self.b_up, self.b_down = b_gate, b_up, b_down  # [E, I], [E, I], [E, D]
        self.alpha, self.limit = alpha, limit

    def __call__(self, x: torch.Tensor, gate: Weight, up: Weight, down: Weight, e: int) -> torch.Tensor:
        g = (linear(x, gate) + self.b_gate[e]).clamp(max=self.limit)  # [Te, I]
        u = (linear(x, up) + self.b_up[e]).clamp(-self.limit, self.limit)  # [Te, I]
        return linear((u + 1) * g * torch.sigmoid(self.alpha * g), down) + self.b_down[e]  # [Te, D]


def packed_expert(parts, index: int, compute: PackedCompute) -> tuple[PackedMatrix, PackedMatrix, PackedMatrix]:
    """Gate, up and down of the held expert at `index` of `parts` (native.MoeParts) as packed
    matrices over the same bytes (no copy)."""
    out = []
    for part in (parts.gate, parts.up, parts.down):
        data = part.matrix(index)
        data = data.numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
        with warnings.catch_warnings():  # a read-only file mapping: torch warns, PackedMatrix only reads it
            warnings.simplefilter("ignore", UserWarning)
            out.append(PackedMatrix(data.view(np.uint8).reshape(-1), part.type, (part.n_rows, part.row_len), compute))
    return out[0], out[1], out[2]


__all__ = ["ClampedSwiGLU", "packed_expert"]
