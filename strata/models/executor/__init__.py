"""The native executor: packed compute on the CPU (float32 activations, weights in their file types
multiplied by the native kernels), one class per layer kind beside its torch reference, any number of
tokens (prefill chunks per call, decode steps fused: each attention kind's `decode_layer` is its
native decode step, which strata.runtime composes into a block's fused step or the decode program).

Each attention kind's class registers itself (`strata.models.kinds.implements(kind, "native")`) in
its module here; `TORCH` and `NATIVE` name the classes both implementations share (norm, router,
shared expert). The loader builds a layer from its spec's kind (strata.models.kinds.build) in the
implementation its compute asks for.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..layers import RMSNorm, SharedExpert
from ..moe import Router
from .ffn import DENSE_ROUTING, NativeNorm, NativeRouter, PackedExperts, PackedSharedExpert


@dataclass(frozen=True)
class Implementation:
    """The classes of one implementation besides the attention kinds' (strata.models.kinds): norm,
    router, shared expert (and packed dense FFN)."""

    name: str  # "torch" or "native": the attention kinds' classes are registered under it
    norm: type  # (weight, eps) -> the norm
    router: type  # Router's arguments -> the router
    shared: Callable  # (ffn, gate or None, compute) -> the shared expert


TORCH = Implementation("torch", RMSNorm, Router, lambda ffn, gate, compute: SharedExpert(ffn, gate))
NATIVE = Implementation("native", NativeNorm, NativeRouter, PackedSharedExpert)

__all__ = ["DENSE_ROUTING", "Implementation", "NATIVE", "NativeNorm", "NativeRouter", "PackedExperts",
           "PackedSharedExpert", "TORCH"]
