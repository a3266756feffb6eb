"""Llama 4's attention and experts (`Arch.chunked`, `Arch.expert_input_scaled`), in torch on every
path (float and packed per-call, where decode attention is the native call's; the fused decode
step and the decode program lack them and say so).

ChunkedAttention: a local layer rotates q and k (RoPE), then normalises each head of both to unit
RMS (no weight: Llama4TextL2Norm, llama.cpp's rms_norm) when the model has that norm, and each
query sees the keys of its own chunk of `chunk` positions only (chunk = position // chunk, causal
within it); a global (NoPE) layer leaves q and k unrotated, scales each query by the temperature
1 + scale * ln(floor((pos + 1) / floor) + 1) (the temperature tuning of transformers'
Llama4TextAttention and llama.cpp's attn_temp input), and attends causally over every position.

InputScaledMoE: the router's weight of each chosen expert multiplies the expert's input
(llama.cpp's weight_before_ffn), not its output; the top k picks run as T*K tokens of one routed call.
Must not: read files or allocate the cache.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from strata import native

from .attention import Attention, AttentionWeights
from .batch import Batch
from .layers import linear
from .moe import MoE
from .rope import Rope


class ChunkedAttention(Attention):
    """One layer of Llama 4's attention (see the module docstring)."""

    fusable = False
    unfused_why = "chunked local attention, NoPE layers and query temperature (llama4) are per-call only"

    def __init__(self, w: AttentionWeights, n_head: int, n_head_kv: int, head_dim: int, rope: Rope, layer: int,
                 chunk: int, nope: bool, l2_eps: float | None, temperature: tuple[int, float] | None,
                 native: bool = False):
        super().__init__(w, n_head, n_head_kv, head_dim, rope, layer, 0, native)
        self.chunk = 0 if nope else chunk  # > 0: queries see their own chunk of this many positions only
        self.nope, self.l2_eps = nope, l2_eps  # l2_eps: the L2 qk-norm's epsilon on RoPE layers (None: none)
        self.temperature = temperature if nope else None  # (floor, scale) of the query temperature

    def forward(self, x: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor],
                kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        q, k, v = self.project(x)  # [T, H, hd], [T, Hkv, hd], [T, Hkv, hd]
        if not self.nope:
            q, k = self.rope.apply(q, *cos_sin), self.rope.apply(k, *cos_sin)
            if self.l2_eps is not None:
                q, k = _l2(q, self.l2_eps), _l2(k, self.l2_eps)
        elif self.temperature is not None:
            q = q * query_temperature(batch.positions, *self.temperature)[:, None, None].to(q.dtype)
        k_cache, v_cache = kv
        batch.write(k_cache, k)
        batch.write(v_cache, v)
        if self.native and batch.is_decode:
            out = self.attend_decode_native(q, batch, k_cache, v_cache)
        else:
            out = attend_chunked(q, batch, k_cache, v_cache, self.chunk)
        return linear(out, self.w.wo, self.w.bo)  # [T, D]

    def attend_decode_native(self, q: torch.Tensor, batch: Batch, k_cache: torch.Tensor,
                             v_cache: torch.Tensor) -> torch.Tensor:
        """One new token per sequence in the native decode attention (float32 on the CPU): a global
        layer over every position, a local one over its own chunk, the window from the chunk's first
        position (one call per sequence: their windows differ). q [B, H, hd] -> [B, H*hd]."""
        q = q.float()
        out = torch.empty((q.shape[0], self.n_head * self.head_dim), dtype=torch.float32)  # [B, H*hd]
        n_ctx, scale = batch.positions + 1, self.head_dim ** -0.5
        if self.chunk == 0:
            return native.attn_decode(q, k_cache, v_cache, batch.block_table, n_ctx, scale, out)
        for b, pos in enumerate(batch.positions.tolist()):
            native.attn_decode(q[b:b + 1], k_cache, v_cache, batch.block_table[b:b + 1], n_ctx[b:b + 1], scale,
                               out[b:b + 1], window=pos % self.chunk + 1)
        return out


def query_temperature(positions: torch.Tensor, floor: int, scale: float) -> torch.Tensor:
    """[T] float32 factor of each query: 1 + scale * ln(floor((pos + 1) / floor) + 1)."""
    return torch.log1p(torch.floor((positions.float() + 1.0) / floor)) * scale + 1.0


def _l2(x: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def attend_chunked(q: torch.Tensor, batch: Batch, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   chunk: int) -> torch.Tensor:
    """Causal attention of each sequence over its cache, within chunks of `chunk` positions when
    chunk > 0: q [T, H, hd] -> [T, H*hd]."""
    outs = []
    for b, (start, n, off) in enumerate(zip(batch.starts, batch.lengths, batch.offsets)):
        k, v = batch.read(k_cache, b), batch.read(v_cache, b)  # [Hkv, L, hd]
        rows = torch.arange(start, start + n, device=q.device)[:, None]  # [n, 1]
        cols = torch.arange(start + n, device=q.device)[None, :]  # [1, L]
        keep = cols <= rows
        if chunk > 0:
            keep = keep & (cols // chunk == rows // chunk)  # [n, L]
        out = F.scaled_dot_product_attention(q[off:off + n].transpose(0, 1)[None], k[None].to(q.dtype),
                                             v[None].to(q.dtype), attn_mask=keep, enable_gqa=True)  # [1, H, n, hd]
        outs.append(out[0].transpose(0, 1).flatten(1))  # [n, H*hd]
    return torch.cat(outs) if len(outs) > 1 else outs[0]  # [T, H*hd]


class InputScaledMoE(MoE):
    """Routed experts whose router weight scales their input; plus the shared expert."""

    unfused_why = "experts scaled at their input (llama4) run per call"

    @property
    def fusable(self) -> bool:
        return False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = self.router(x)  # [T, K], [T, K]
        T, K = expert_ids.shape
        # each pick a token of its own (row t*K + j), its input x[t] * its weight: one routed call
        picks = (x[:, None, :] * weights[:, :, None].to(x.dtype)).reshape(T * K, -1)  # [T*K, D]
        ones = torch.ones((T * K, 1), dtype=weights.dtype, device=x.device)
        y = self.experts(picks, ones, expert_ids.reshape(T * K, 1)).view(T, K, -1)  # [T, K, D]
        out = y[:, 0]
        for j in range(1, K):  # the picks' sum in pick order
            out = out + y[:, j]
        return out if self.shared is None else out + self.shared(x)


__all__ = ["ChunkedAttention", "InputScaledMoE", "attend_chunked", "query_temperature"]
