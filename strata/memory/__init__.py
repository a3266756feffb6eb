"""Expert memory: how model code reaches the weights of routed experts.

Model code asks an `ExpertMemory` for the experts a layer's router chose (`acquire`), computes,
and gives them back (`release`); `prefetch` announces experts it will ask for soon. Where the
bytes live (the memory-mapped file, host RAM, device slots) is the implementation's business,
so `TieredExpertMemory` (device slots, host tier, pager, prefetch) replaces `DirectExpertMemory`
without a change to `strata.models`.
"""
from .base import ExpertMemory, ExpertWeights
from .direct import DirectExpertMemory
from .stats import MemoryStats
from .tiered import TieredConfig, TieredExpertMemory

__all__ = ["DirectExpertMemory", "ExpertMemory", "ExpertWeights", "MemoryStats", "TieredConfig", "TieredExpertMemory"]
