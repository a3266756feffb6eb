"""What runs each step: the plan decided once at load (`plan`), and the runners it names (the
decode program, fused decode steps, the hybrid CPU side), built and kept by `Runner`.

Sits between strata.models (the maths) and strata.engine (scheduling): it may import models and
memory; the engine imports it.
"""
from .plan import FLOAT, FUSED, PACKED, PROGRAM, ArchCaps, MemoryCaps, RuntimePlan, Target, decide
from .runner import Runner, arch_caps, build

__all__ = ["ArchCaps", "FLOAT", "FUSED", "MemoryCaps", "PACKED", "PROGRAM", "Runner", "RuntimePlan", "Target",
           "arch_caps", "build", "decide"]
