"""The native executor of sparse latent attention (DeepSeek-V3.2 `deepseek32`, GLM-5 `glm-dsa`):
packed compute on the CPU, float32, any number of tokens. Latent attention's native calls
(strata.models.executor.mla: the projections, each head's k_b / v_b product, decode attention
while every position is kept) with the indexer's products packed too; the indexer's scores, its
top-k and attention over the kept positions run through the torch reference's functions. No
fused decode step: the native step has no indexer (the layer spec's `unfused()`).
Must not: allocate the cache or read files.
"""
from __future__ import annotations

from ..dsa import DSAttention
from ..kinds import implements
from ..spec import DSA
from .mla import NativeMLAttention


@implements(DSA, "native")
class NativeDSAttention(DSAttention, NativeMLAttention):
    """Sparse latent attention through latent attention's native calls (see the module docstring)."""

    def decode_layer(self, common: dict):
        raise NotImplementedError("sparse attention: the native step has no indexer")


__all__ = ["NativeDSAttention"]
