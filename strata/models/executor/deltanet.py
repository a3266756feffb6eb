"""The native executor of gated DeltaNet layers (qwen3next, qwen35moe): packed compute on the CPU,
float32, any number of tokens. Per call: the stacked input projection from packed blocks, then the
gates, the causal convolution, the recurrence and the gated norm as native calls on the slots'
states; a decode step fused (`decode_layer`): the DeltaNet half, the FFN's norm and the router in
one native call (`DecodeDeltaNet`, this kind's binding of native/executor/deltanet.c), the same
functions, so both give the same bytes.
Must not: allocate the states (the KV cache does) or read files.
"""
from __future__ import annotations

import torch

from strata import native

from ..deltanet import GatedDeltaNet
from ..kinds import implements
from ..spec import DELTANET
from .attention import f32


@implements(DELTANET, "native")
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

    def decode_layer(self, common: dict) -> DecodeDeltaNet:
        """The layer's native decode step (`common`: the block's norms and router arguments)."""
        return DecodeDeltaNet(self, common)


class DecodeDeltaNet(native.LayerStep):
    """A gated DeltaNet layer's decode half (and its router, for an MoE layer), described once
    (strata_deltanet_layer, native/executor/deltanet.h): the layer's stacked input projection
    (q|k|v, z and b|a by rows; `w_in_ba`: b|a per key head, qwen3next's wba), w_out [D, Hv dv], conv
    [C, K], dt and A [Hv], the norm [dv]; the states bound per cache (`bind_states`)."""

    STRUCT, STEP, BIND = "strata_deltanet_layer", "strata_decode_deltanet", "bind_states"
    state_slots, what = True, "DeltaNet decode step"

    def __init__(self, layer: NativeDeltaNet, common: dict):
        w, Hv, dk, dv = layer.w, layer.hv, layer.dk, layer.dv
        D, C, K = w.wout.shape[0], 2 * layer.hk * dk + Hv * dv, int(w.conv.shape[-1])
        conv, dt, a, norm = f32(w.conv), f32(w.dt), f32(w.a), f32(w.norm)
        p = native.f32_ptr
        super().__init__(native.layer_head(D, **common), {
            "n_k_heads": layer.hk, "n_v_heads": Hv, "head_k_dim": dk, "head_v_dim": dv, "conv_kernel": K,
            "tiled": 1 if layer.tiled else 0, "ba_per_key_head": 1 if w.w_in_ba else 0, "ssm_eps": layer.eps,
            "in_type": int(w.w_in.type), "out_type": int(w.wout.type),
            "w_in": native.void_ptr(w.w_in._data_t), "w_out": native.void_ptr(w.wout._data_t),
            "w_in_bytes": w.w_in._data_t.numel(), "w_out_bytes": w.wout._data_t.numel(),
            "conv": p(conv, "conv weight", C * K), "dt": p(dt, "dt", Hv), "ssm_a": p(a, "ssm_a", Hv),
            "ssm_norm": p(norm, "ssm_norm", dv)}, (common, w.w_in._data_t, w.wout._data_t, conv, dt, a, norm))
        self.channels = C

    def bind_states(self, conv_state: torch.Tensor, ssm_state: torch.Tensor) -> None:
        """Point at the layer's per-slot states: conv [S, K-1, C] and ssm [S, Hv, dk, dv], contiguous
        float32 on the CPU; cheap when unchanged."""
        key = (conv_state.data_ptr(), ssm_state.data_ptr())
        if key == self._bound:
            return
        c, S = self.c, conv_state.shape[0]
        conv = (S, c.conv_kernel - 1, self.channels)
        ssm = (S, c.n_v_heads, c.head_k_dim, c.head_v_dim)
        if tuple(conv_state.shape) != conv or tuple(ssm_state.shape) != ssm or S < 1:
            raise ValueError(f"decode step: states {tuple(conv_state.shape)} and {tuple(ssm_state.shape)} must be "
                             f"[S, {conv[1]}, {conv[2]}] and [S, {ssm[1]}, {ssm[2]}, {ssm[3]}]")
        c.conv_state = native.f32_ptr(conv_state, "conv state")
        c.ssm_state = native.f32_ptr(ssm_state, "ssm state")
        c.n_slots = S
        self._keep_states, self._bound = (conv_state, ssm_state), key

    bind = bind_states

    def run(self, pool, slots: torch.Tensor, positions: torch.Tensor, x: torch.Tensor, out: native.StepOutputs,
            scratch: torch.Tensor, impl: str = "auto") -> int:
        """`call` with sequence b in state row slots[b] (int64 [B])."""
        return self.call(pool, x, out, scratch, positions, slots=slots, impl=impl)

    def trouble(self, B: int, slots) -> str:
        return f"slots {slots.tolist()} of {self.c.n_slots}, scratch of at least {self.scratch_bytes(B)} bytes?"


__all__ = ["DecodeDeltaNet", "NativeDeltaNet"]
