"""Expert memory: how model code reaches the weights of routed experts.

Model code asks an `ExpertMemory` for the experts a layer's router chose (`start`, and `finish`
for those still being read), computes, and gives them back (`release`); a memory that takes hints
offers a `prefetcher`, to which the model announces experts it will ask for soon. Where the bytes
live (the memory-mapped file, host RAM, device slots) is the implementation's business, so
`TieredExpertMemory` (device slots, host tier, pager, prefetch) replaces `DirectExpertMemory`
without a change to `strata.models`. Predictors of the next layers' experts live in `predict/`,
every budget and prefetch default in `budget.py`.

Must not hold code: the package's public names, re-exported.
"""
from .base import ExpertLayers, ExpertMemory, ExpertWeights, FixedExperts, HybridHost, PackedExperts, Prefetcher
from .budget import TieredConfig
from .direct import DirectExpertMemory
from .stats import MemoryStats
from .tiered import TieredExpertMemory

__all__ = ["DirectExpertMemory", "ExpertLayers", "ExpertMemory", "ExpertWeights", "FixedExperts", "HybridHost",
           "MemoryStats", "PackedExperts", "Prefetcher", "TieredConfig", "TieredExpertMemory"]
