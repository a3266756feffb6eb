"""What an architecture is to the model builder: a few facts about which weights it has.

Everything else (sizes, rope arrangement and scaling, router function and normalisation, which
layers are dense) comes from the file's metadata through `strata.gguf.HParams`.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    name: str  # GGUF general.architecture
    qk_norm: str | None = None  # RMSNorm of q and k before RoPE: "head" (over hd) or "full" (over H*hd)
    attn_bias: bool = False  # q, k and v projections have biases
    shared_expert: bool = False  # an always-on shared expert, gated by sigmoid(ffn_gate_inp_shexp . x)


__all__ = ["Architecture"]
