"""Hybrid compute (CUDA): missed experts the host tier holds computed on the CPU instead of copied.

    plan.py     the decision: measured rates, one chunk's misses -> copy or CPU (no I/O, no torch)
    split.py    `HybridExec`: a chunk split by the plan, the CPU experts pinned in the host tier
    compute.py  `HybridCompute`: the CPU share in one native call beside the device's GEMMs

What it reads of the memory is one record, `ExpertMemory.hybrid` (`HybridHost`: the compact host
tier, whether an expert sits on the device, the copies' times). Must not hold code: the package's
public names, re-exported.
"""
from .compute import HybridCompute
from .plan import COPY, CPU, ExpertMiss, HybridPlan, HybridRates, plan_misses
from .split import HybridExec, HybridSplit, layer_format, split_chunk

__all__ = ["COPY", "CPU", "ExpertMiss", "HybridCompute", "HybridExec", "HybridPlan", "HybridRates", "HybridSplit",
           "layer_format", "plan_misses", "split_chunk"]
