"""Routed experts that are not plain SwiGLU: gpt-oss's biased, clamped SwiGLU,

    g = gate_e x + bg_e,  u = up_e x + bu_e
    out = down_e ((clamp(u, -limit, limit) + 1) * min(g, limit) * sigmoid(alpha * min(g, limit))) + bd_e

(llama.cpp's `swiglu_oai`, transformers' GptOssExperts), and Llama 4's input-scaled SwiGLU: each
assignment's input is x times its router weight, its output added unweighted (llama.cpp's
weight_before_ffn; `input_scaled`: float_experts and the native call apply the weight there).
On float weights each expert runs one product at a time through `linear`; packed compute runs the
fused native MoE call with the function (`native()`: its `native.MoeAct`), every chosen expert in
one call as for plain SwiGLU.
Must not: reach expert bytes other than those the memory handed out.
"""
from __future__ import annotations

import torch

from strata import native

from .layers import Weight, linear, swiglu


class ClampedSwiGLU:
    """Expert e's FFN with its biases: call with rows x [Te, D] and that expert's matrices."""

    input_scaled = False

    def __init__(self, b_gate: torch.Tensor, b_up: torch.Tensor, b_down: torch.Tensor, alpha: float, limit: float):
        self.b_gate, self.b_up, self.b_down = b_gate, b_up, b_down  # [E, I], [E, I], [E, D]
        self.alpha, self.limit = alpha, limit
        self._native: native.MoeAct | None = None

    def __call__(self, x: torch.Tensor, gate: Weight, up: Weight, down: Weight, e: int) -> torch.Tensor:
        g = (linear(x, gate) + self.b_gate[e]).clamp(max=self.limit)  # [Te, I]
        u = (linear(x, up) + self.b_up[e]).clamp(-self.limit, self.limit)  # [Te, I]
        return linear((u + 1) * g * torch.sigmoid(self.alpha * g), down) + self.b_down[e]  # [Te, D]

    def native(self) -> native.MoeAct:
        """This function as the fused MoE call takes it (built once; float32 copies of the biases)."""
        if self._native is None:
            self._native = native.MoeAct(*(b.detach().float().contiguous().numpy() for b in
                                           (self.b_gate, self.b_up, self.b_down)), self.alpha, self.limit)
        return self._native


class InputScaled:
    """Llama 4's experts: SwiGLU of rows x [Te, D] already scaled by their router weights."""

    input_scaled = True

    def __init__(self):
        self._native: native.MoeAct | None = None

    def __call__(self, x: torch.Tensor, gate: Weight, up: Weight, down: Weight, e: int) -> torch.Tensor:
        return swiglu(x, gate, up, down)

    def native(self) -> native.MoeAct:
        if self._native is None:
            self._native = native.MoeAct.scaled_input()
        return self._native


__all__ = ["ClampedSwiGLU", "InputScaled"]
