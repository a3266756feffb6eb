"""The native executor: packed compute on the CPU (float32 activations, weights in their file types
multiplied by the native kernels), one class per layer kind beside its torch reference, any number of
tokens (prefill chunks per call, decode steps fused: each attention kind's `decode_layer` is its
native decode step, which strata.runtime composes into a block's fused step or the decode program).

`TORCH` and `NATIVE` name each kind's class in the two implementations; the loader builds a layer
from the one its compute asks for and the layer's spec (strata.models.spec).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..attention import Attention
from ..chunked import ChunkedAttention
from ..deltanet import GatedAttention, GatedDeltaNet
from ..layers import RMSNorm, SharedExpert
from ..mla import MLAttention
from ..moe import Router
from ..spec import CHUNKED, DELTANET, GATED, GQA, MLA
from .attention import NativeAttention, NativeChunkedAttention, NativeGatedAttention
from .deltanet import NativeDeltaNet
from .ffn import DENSE_ROUTING, NativeNorm, NativeRouter, PackedExperts, PackedSharedExpert
from .mla import NativeMLAttention


@dataclass(frozen=True)
class Implementation:
    """The classes of one implementation: norm, router, shared expert (and packed dense FFN), and
    the attention class of each attention kind."""

    name: str  # "torch" or "native"
    norm: type  # (weight, eps) -> the norm
    router: type  # Router's arguments -> the router
    shared: Callable  # (ffn, gate or None, compute) -> the shared expert
    attention: dict  # attention kind (strata.models.spec) -> its class


TORCH = Implementation("torch", RMSNorm, Router, lambda ffn, gate, compute: SharedExpert(ffn, gate), {
    GQA: Attention, GATED: GatedAttention, CHUNKED: ChunkedAttention, MLA: MLAttention, DELTANET: GatedDeltaNet})
NATIVE = Implementation("native", NativeNorm, NativeRouter, PackedSharedExpert, {
    GQA: NativeAttention, GATED: NativeGatedAttention, CHUNKED: NativeChunkedAttention, MLA: NativeMLAttention,
    DELTANET: NativeDeltaNet})

__all__ = ["DENSE_ROUTING", "Implementation", "NATIVE", "NativeNorm", "NativeRouter", "PackedExperts",
           "PackedSharedExpert", "TORCH"]
