"""Llama 4's attention (`Arch.chunked`), the torch reference (the native executor:
strata.models.executor.attention, NativeChunkedAttention).

ChunkedAttention: a local layer rotates q and k (RoPE), then normalises each head of both to unit
RMS (no weight: Llama4TextL2Norm, llama.cpp's rms_norm) when the model has that norm, and each
query sees the keys of its own chunk of `chunk` positions only (chunk = position // chunk, causal
within it); a global (NoPE) layer leaves q and k unrotated, scales each query by the temperature
1 + scale * ln(floor((pos + 1) / floor) + 1) (the temperature tuning of transformers'
Llama4TextAttention and llama.cpp's attn_temp input; computed in float64, rounded to float32), and
attends causally over every position.

Llama 4's experts (the router's weight scales each expert's input: llama.cpp's weight_before_ffn)
are `strata.models.expert_act.InputScaled`.
Must not: read files or allocate the cache.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention import Attention, AttentionWeights, read_gqa_weights
from .batch import Batch
from .kinds import implements, reader
from .layers import linear
from .rope import Rope
from .spec import CHUNKED


@implements(CHUNKED, "torch")
class ChunkedAttention(Attention):
    """One layer of Llama 4's attention (see the module docstring)."""

    def __init__(self, w: AttentionWeights, n_head: int, n_head_kv: int, head_dim: int, rope: Rope, layer: int,
                 chunk: int, nope: bool, l2_eps: float | None, temperature: tuple[int, float] | None):
        super().__init__(w, n_head, n_head_kv, head_dim, rope, layer, 0)
        self.chunk = 0 if nope else chunk  # > 0: queries see their own chunk of this many positions only
        self.nope, self.l2_eps = nope, l2_eps  # l2_eps: the L2 qk-norm's epsilon on RoPE layers (None: none)
        self.temperature = temperature if nope else None  # (floor, scale) of the query temperature

    def forward(self, x: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor],
                kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        q, k, v = self.project(x)  # [T, H, hd], [T, Hkv, hd], [T, Hkv, hd]
        k_cache, v_cache = kv
        if not self.nope:
            q, k = self.rope.apply(q, *cos_sin), self.rope.apply(k, *cos_sin)
            if self.l2_eps is not None:
                q, k = _l2(q, self.l2_eps), _l2(k, self.l2_eps)
        elif self.temperature is not None:
            q = q * query_temperature(batch.positions, *self.temperature)[:, None, None].to(q.dtype)
        batch.write(k_cache, k)
        batch.write(v_cache, v)
        out = attend_chunked(q, batch, k_cache, v_cache, self.chunk)
        return linear(out, self.w.wo, self.w.bo)  # [T, D]


@reader(CHUNKED)
def read_chunked(cls, w, arch, hp, spec, rope: Rope) -> ChunkedAttention:
    """Layer spec.index's Llama 4 attention (a chunked local layer or a global NoPE one) as `cls`."""
    a, weights = spec.attention, read_gqa_weights(w, arch, hp, spec)
    temp = (hp.attn_temperature_length, hp.attn_temperature_scale) if hp.attn_temperature_scale else None
    return cls(weights, hp.n_head, hp.n_head_kv, hp.head_dim, rope, spec.index, hp.attn_chunk, a.nope, a.l2_eps, temp)


def query_temperature(positions: torch.Tensor, floor: int, scale: float) -> torch.Tensor:
    """[T] float32 factor of each query: 1 + scale * ln(floor((pos + 1) / floor) + 1), computed in
    float64 in the order the native step computes it (so both round to the same float)."""
    return (torch.log1p(torch.floor((positions.double() + 1.0) / floor)) * scale + 1.0).float()


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


__all__ = ["ChunkedAttention", "attend_chunked", "query_temperature", "read_chunked"]
