"""What runs each kind of step, and why: the one place that decides, once, at load.

    plan = decide(Target("cpu", "packed"), MemoryCaps.of(memory, layers), arch_caps(model))  # runner.py
    plan.describe()  # "decode: program; prefill: packed per-call; hybrid: off — why: ..."

Runners, fastest first (each computes the same maths as the float reference, strata.models):
- decode "program": every layer of a decode step in one native call (strata.runtime.program);
- decode "fused step": a block's attention half and router in one native call, its experts in
  the fused MoE call, blocks one by one (strata.runtime.step); blocks without a fused form run
  per call;
- "packed per-call": the model's own forward with packed weights and native glue;
- "float": the model's own forward in torch on dequantized weights (the reference; CUDA's).
Hybrid: plain routed experts split each chunk between the device and the CPU
(strata.runtime.hybrid), where the tiered memory measures it to pay.
Memory: the default expert memory of packed compute on the CPU is settled from the file before
anything is built (`default_memory_row`): read in place from the mapped file (direct) when its
experts fit the RAM budget and sit in the page cache, else paged into RAM slots.
Must not: build anything (strata.runtime.runner does, from the plan), or measure (the loader
hands in `FileFit`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from strata.units import format_bytes

PROGRAM, FUSED, PACKED, FLOAT = "program", "fused step", "packed per-call", "float"


@dataclass(frozen=True)
class Target:
    """Where and how the model computes: device type ("cpu", "cuda") and compute ("packed", "float")."""

    device: str
    compute: str


@dataclass(frozen=True)
class MemoryCaps:
    """What the expert memory offers the runners. kind: "direct", "paged", "tiered" ("none": a
    model without routed experts); packed: it hands out experts in their file format; prefetch_depth:
    layers of look-ahead it takes (announced between layers, in Python); fixed: every layer's
    packed experts stay where they are (`fixed_packed`), so a native program may read them; hybrid:
    it splits missed experts between the device and the CPU; why: how the kind was chosen (the
    loader's words; "" : as asked)."""

    kind: str
    packed: bool = False
    prefetch_depth: int = 0
    fixed: bool = False
    hybrid: bool = False
    why: str = ""

    @staticmethod
    def of(memory, layers: Sequence[int], why: str = "") -> MemoryCaps:
        if memory is None:
            return MemoryCaps("none", why="the model has no routed experts")
        kind = type(memory).__name__.removesuffix("ExpertMemory").lower() or "custom"
        fixed = memory.packed and all(memory.fixed_packed(layer) is not None for layer in layers)
        return MemoryCaps(kind, memory.packed, memory.prefetch_depth, fixed, bool(memory.hybrid), why)


@dataclass(frozen=True)
class ArchCaps:
    """What the built model's blocks allow: how many of n_blocks the fused decode step computes
    (`unfused`: why the others not), and why the decode program cannot take the model (None: it
    can; strata.runtime.program.DecodeProgram.takes)."""

    n_blocks: int
    fused_blocks: int
    unfused: str | None = None
    program: str | None = None


@dataclass(frozen=True)
class RuntimePlan:
    """The runner of each kind of step, and one short reason each; and the expert memory's kind
    they run with, and how it was chosen."""

    decode: str
    prefill: str
    hybrid: bool
    decode_why: str
    prefill_why: str
    hybrid_why: str
    memory: str = "none"  # the expert memory that runs (MemoryCaps.kind: "direct", "paged", "tiered", ...)
    memory_why: str = ""

    def describe(self) -> str:
        return (f"decode: {self.decode}; prefill: {self.prefill}; hybrid: {'on' if self.hybrid else 'off'}; "
                f"memory: {self.memory} — why: decode: {self.decode_why}; prefill: {self.prefill_why}; "
                f"hybrid: {self.hybrid_why}; memory: {self.memory_why or 'as asked'}")

    def rows(self) -> list[tuple[str, str, str]]:
        """(step, runner, why) of each kind of step, then ("memory", kind, why)."""
        return [("decode", self.decode, self.decode_why), ("prefill", self.prefill, self.prefill_why),
                ("hybrid", "on" if self.hybrid else "off", self.hybrid_why),
                ("memory", self.memory, self.memory_why or "as asked")]


#: Share of the experts' sampled pages that must be in the page cache for the default to read
#: them in place: a file read once is (nearly) all cached; one partly evicted is paged.
PAGE_CACHE_SHARE = 0.9


@dataclass(frozen=True)
class FileFit:
    """What settles the default memory of packed compute on the CPU, measured by the loader:
    experts: bytes of a RAM slot for every expert (the paged memory's budget that evicts nothing);
    budget: the RAM budget the paged memory would get (--host-mem, or the machine's share less the
    resident weights and KV cache); resident: the share of the experts' pages in the page cache
    (`strata.memory.residency`; None: this system cannot tell)."""

    experts: int
    budget: int
    resident: float | None


def default_memory_row(fit: FileFit) -> tuple[str, str]:
    """The memory row when none was asked for (packed compute on the CPU): (kind, why). "direct"
    (experts read in place from the mapped file, as llama.cpp reads them: nothing copied, nothing
    read again) when they fit the RAM budget and sit in the page cache; else "paged": its pager
    reads them into RAM slots, around the page cache (O_DIRECT) when they do not fit."""
    sizes = f"experts {format_bytes(fit.experts)}, RAM budget {format_bytes(fit.budget)}"
    if fit.experts > fit.budget:
        return "paged", (f"the experts do not fit the RAM budget ({sizes}): paged into RAM slots, read around the "
                         f"page cache (O_DIRECT)")
    if fit.resident is None:
        return "paged", f"the file fits in RAM ({sizes}); whether it is in the page cache cannot be told here"
    cached = f"{100 * fit.resident:.0f}% of the experts' pages in the page cache"
    if fit.resident < PAGE_CACHE_SHARE:
        return "paged", (f"the file fits in RAM ({sizes}) but is not in the page cache ({cached}): the pager reads "
                         f"its experts, through the cache (a next run maps them in place)")
    return "direct", (f"the file fits in RAM and is in the page cache ({sizes}, {cached}): experts are read in "
                      f"place from the mapped file (--memory paged copies them into RAM slots)")


def decide(target: Target, memory: MemoryCaps, arch: ArchCaps) -> RuntimePlan:
    """The plan of a model: the first row that matches decides each kind of step."""
    prefill, prefill_why = ((PACKED, "packed compute: the native kernels multiply the file's blocks")
                            if target.compute == "packed" else (FLOAT, f"float compute on {target.device}"))
    hybrid, hybrid_why = hybrid_row(target, memory)
    decode, decode_why = _decode_row(target, memory, arch)
    return RuntimePlan(decode, prefill, hybrid, decode_why, prefill_why, hybrid_why, memory.kind, memory.why)


def hybrid_row(target: Target, memory: MemoryCaps) -> tuple[bool, str]:
    """The hybrid row of the table (the runtime reads it before building the model, whose
    experts are given the CPU side at construction)."""
    if memory.hybrid:
        return True, f"the {memory.kind} memory computes missed experts on the CPU where that beats copying"
    if target.compute == "packed":
        return False, "packed compute runs every expert on the CPU already"
    return False, f"the {memory.kind} memory computes no experts on the CPU (TieredConfig.hybrid)"


def _decode_row(target: Target, memory: MemoryCaps, arch: ArchCaps) -> tuple[str, str]:
    if target.compute != "packed":
        return FLOAT, f"float compute on {target.device}: dequantized weights, torch multiplies"
    if memory.kind != "none" and not memory.packed:
        return PACKED, f"the {memory.kind} memory hands out float experts"
    if arch.fused_blocks == 0:
        return PACKED, arch.unfused or "no block has a fused decode step"
    partial = "" if arch.fused_blocks == arch.n_blocks else \
        f" ({arch.fused_blocks} of {arch.n_blocks} blocks: {arch.unfused})"
    if memory.prefetch_depth > 0:
        return FUSED, f"the {memory.kind} memory takes look-ahead announcements between layers " \
                      f"(prefetch depth {memory.prefetch_depth}){partial}"
    if arch.program is not None:
        return FUSED, arch.program + partial
    if not memory.fixed:
        return FUSED, f"the {memory.kind} memory moves experts between steps (no fixed_packed)"
    return PROGRAM, f"every block fused and the {memory.kind} memory's experts stay in place"


__all__ = ["ArchCaps", "FLOAT", "FUSED", "FileFit", "MemoryCaps", "PACKED", "PAGE_CACHE_SHARE", "PROGRAM",
           "RuntimePlan", "Target", "decide", "default_memory_row", "hybrid_row"]
