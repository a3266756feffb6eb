"""The tiered expert memory: device slots, a host tier and the file, with prefetch.

    memory.py  `TieredExpertMemory`, the acquire path (the `ExpertMemory` protocol)
    loads.py   `SlotLoads`: loads into device slots, their lock and job state, the loader thread

Start-up placement is `strata.memory.startup`'s (shared with the paged memory), budgets and
settings `strata.memory.budget`'s. Must not hold code: the package's public names, re-exported.
"""
from ..budget import TieredConfig
from .memory import TieredExpertMemory

__all__ = ["TieredConfig", "TieredExpertMemory"]
