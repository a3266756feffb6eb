"""The native executor of gated DeltaNet layers (qwen3next, qwen35moe): packed compute on the CPU,
float32, any number of tokens. Per call: the stacked input projection from packed blocks, then the
gates, the causal convolution, the recurrence and the gated norm as native calls on the slots'
states; a decode step fused (`decode_layer`): the DeltaNet half, the FFN's norm and the router in
one native call (`native.DecodeDeltaNet`), the same functions, so both give the same bytes.
Must not: allocate the states (the KV cache does) or read files.
"""
from __future__ import annotations

import torch

from strata import native

from ..deltanet import GatedDeltaNet
from .attention import f32


class NativeDeltaNet(GatedDeltaNet):
    """A gated DeltaNet layer through the native calls (see the module docstring)."""

    def sequence(self, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, conv_state: torch.Tensor,
                 ssm_state: torch.Tensor, slot: int) -> torch.Tensor:
        mixed = native.deltanet_conv(qkv, self.w.conv, conv_state[slot], torch.empty_like(qkv))
        o = torch.empty((qkv.shape[0], self.hv, self.dv), dtype=torch.float32)
        return native.deltanet_recur(mixed, g, beta, ssm_state[slot], o, self.hk, self.tiled)

    def norm_gate(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return native.deltanet_norm_gate(o, z, self.w.norm, self.eps, torch.empty((o.shape[0], self.hv * self.dv)))

    def gates(self, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return native.deltanet_gates(b.contiguous(), a.contiguous(), self.w.dt, self.w.a, torch.empty(b.shape),
                                     torch.empty(b.shape))

    def decode_layer(self, common: dict) -> native.DecodeDeltaNet:
        """The layer's native decode step (`common`: the block's norms and router arguments)."""
        w = self.w
        return native.DecodeDeltaNet(
            **common, n_embd=w.wout.shape[0], n_k_heads=self.hk, n_v_heads=self.hv, head_k_dim=self.dk,
            head_v_dim=self.dv, tiled=self.tiled, ba_per_key_head=w.w_in_ba, ssm_eps=self.eps,
            w_in=(w.w_in.type, w.w_in._data_t), w_out=(w.wout.type, w.wout._data_t), conv=f32(w.conv), dt=f32(w.dt),
            ssm_a=f32(w.a), ssm_norm=f32(w.norm))


__all__ = ["NativeDeltaNet"]
