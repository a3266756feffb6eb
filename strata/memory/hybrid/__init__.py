"""Hybrid compute, the memory's side: which missed experts the CPU computes from their host
slots instead of copying them to the device, and holding those slots while it does.

    plan.py   the decision: measured rates, one chunk's misses -> copy or CPU (no I/O, no torch)
    split.py  `HybridExec`: a chunk split by the plan, the CPU experts pinned in the host tier

The model's side (running the CPU experts beside the device's) is `strata.models.hybrid`.
Must not hold code: the package's public names, re-exported.
"""
from .plan import COPY, CPU, ExpertMiss, HybridPlan, HybridRates, plan_misses
from .split import HybridExec, HybridSplit, layer_format, split_chunk

__all__ = ["COPY", "CPU", "ExpertMiss", "HybridExec", "HybridPlan", "HybridRates", "HybridSplit", "layer_format",
           "plan_misses", "split_chunk"]
