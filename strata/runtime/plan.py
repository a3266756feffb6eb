"""What runs each kind of step, and why: the one place that decides, once, at load.

    specs = layer_specs(mf, arch)                                   # strata.models.spec, before any weight is read
    plan = decide(Target("cpu", "packed"), MemoryCaps.of(memory), ArchCaps.of(specs, ...))  # runner.py
    plan.describe()  # "decode: program; prefill: packed per-call; hybrid: off — why: ..."

What each layer allows comes from its spec (strata.models.spec), never from built objects.

Runners, fastest first (each computes the same maths as the float reference, strata.models):
- decode "program": every layer of a decode step in one native call (strata.runtime.program);
- decode "fused step": a block's attention half and router in one native call, its experts in
  the fused MoE call, blocks one by one (strata.runtime.step); blocks without a fused form run
  per call;
- "packed per-call": the model's own forward through the native executor (packed weights, native glue);
- "float": the model's own forward through the torch reference on dequantized weights (CUDA's).
Experts: each MoE layer's expert executor (strata.models.spec.expert_executor: packed, hybrid or
float), shown with its reason.
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

from strata.models.spec import LayerSpec, expert_executor
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
    model without routed experts); packed: it hands out experts in their file format (its `form`);
    prefetch_depth: layers of look-ahead its `prefetcher` takes (announced between layers, in
    Python); fixed: its packed experts stay where they are (`fixed`), so a native program may read
    them; hybrid: it splits missed experts between the device and the CPU (`hybrid`); why: how the
    kind was chosen (the loader's words; "" : as asked)."""

    kind: str
    packed: bool = False
    prefetch_depth: int = 0
    fixed: bool = False
    hybrid: bool = False
    why: str = ""

    @staticmethod
    def of(memory, why: str = "") -> MemoryCaps:
        if memory is None:
            return MemoryCaps("none", why="the model has no routed experts")
        depth = 0 if memory.prefetcher is None else memory.prefetcher.prefetch_depth
        fixed, hybrid = memory.fixed is not None, memory.hybrid is not None
        return MemoryCaps(memory.kind, memory.form == "packed", depth, fixed, hybrid, why)


@dataclass(frozen=True)
class ArchCaps:
    """What the model's layers allow, from their specs: how many of n_blocks the fused decode step
    computes (`unfused`: why the others not), and why the decode program cannot take the model
    (None: it can; strata.runtime.program.DecodeProgram.takes)."""

    n_blocks: int
    fused_blocks: int
    unfused: str | None = None
    program: str | None = None

    @staticmethod
    def of(specs: Sequence[LayerSpec], experts_packed: bool, sharded: bool, takes) -> tuple[ArchCaps, list[bool]]:
        """The caps of layers `specs` under packed compute, and whether each block has a fused step.
        experts_packed: the memory hands out packed experts (the fused MoE call's); sharded: expert
        parallelism (the fused step block by block, whose MoE layers combine the ranks' partial sums
        between two native calls; not the program, which runs every layer in one); takes: the
        program's own rule (`DecodeProgram.takes`)."""
        why = [s.unfused() or (None if experts_packed or not s.ffn.moe else "float experts") for s in specs]
        fused = [w is None for w in why]
        first = None if all(fused) else fused.index(False)
        unfused = None if first is None else f"block {first} has no fused form ({why[first]})"
        program = ("expert parallelism: the MoE layers combine the ranks' partial sums between native calls"
                   if sharded else takes(specs, fused))
        return ArchCaps(len(specs), sum(fused), unfused, program), fused


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
    experts: str = "none"  # the MoE layers' expert executors ("packed", "hybrid", "float", or a mix by layer)
    experts_why: str = "the model has no routed experts"

    def describe(self) -> str:
        return (f"decode: {self.decode}; prefill: {self.prefill}; hybrid: {'on' if self.hybrid else 'off'}; "
                f"memory: {self.memory} — why: decode: {self.decode_why}; prefill: {self.prefill_why}; "
                f"hybrid: {self.hybrid_why}; experts: {self.experts}, {self.experts_why}; "
                f"memory: {self.memory_why or 'as asked'}")

    def rows(self) -> list[tuple[str, str, str]]:
        """(step, runner, why) of each kind of step, then ("memory", kind, why) and ("experts",
        executor, why)."""
        return [("decode", self.decode, self.decode_why), ("prefill", self.prefill, self.prefill_why),
                ("hybrid", "on" if self.hybrid else "off", self.hybrid_why),
                ("memory", self.memory, self.memory_why or "as asked"), ("experts", self.experts, self.experts_why)]


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


def decide(target: Target, memory: MemoryCaps, arch: ArchCaps, specs: Sequence[LayerSpec] = ()) -> RuntimePlan:
    """The plan of a model of layers `specs`: the first row that matches decides each kind of step."""
    prefill, prefill_why = ((PACKED, "packed compute: the native kernels multiply the file's blocks")
                            if target.compute == "packed" else (FLOAT, f"float compute on {target.device}"))
    hybrid, hybrid_why = hybrid_row(target, memory, specs)
    decode, decode_why = _decode_row(target, memory, arch)
    experts, experts_why = experts_row(target, memory, specs)
    return RuntimePlan(decode, prefill, hybrid, decode_why, prefill_why, hybrid_why, memory.kind, memory.why,
                       experts, experts_why)


def experts_row(target: Target, memory: MemoryCaps, specs: Sequence[LayerSpec]) -> tuple[str, str]:
    """Each MoE layer's expert executor (`expert_executor`, what the loader builds), by kind:
    (executors, why), layers counted where they differ."""
    moe = [s for s in specs if s.ffn.moe]
    if not moe:
        return "none", "the model has no routed experts"
    packed, hybrid = target.compute == "packed" and memory.packed, memory.hybrid and target.compute != "packed"
    rows = [expert_executor(s.ffn, packed, hybrid) for s in moe]
    kinds = sorted(set(rows), key=rows.index)
    if len(kinds) == 1:
        return kinds[0]
    count = {k: sum(r[0] == k for r in rows) for k, _ in kinds}
    return (", ".join(f"{k} ({count[k]} layer{'' if count[k] == 1 else 's'})" for k, _ in kinds),
            "; ".join(f"{k}: {why}" for k, why in kinds))


def hybrid_row(target: Target, memory: MemoryCaps, specs: Sequence[LayerSpec] = ()) -> tuple[bool, str]:
    """The hybrid row of the table (the runtime reads it before building the model, whose
    experts are given the CPU side at construction); `specs`: the layers, whose expert function
    says whether hybrid compute can run them."""
    if memory.hybrid:
        moe = [s for s in specs if s.ffn.moe]
        off = [s for s in moe if expert_executor(s.ffn, False, True)[0] != "hybrid"]
        if moe and len(off) == len(moe):
            return False, (f"the {memory.kind} memory would split missed experts with the CPU, but "
                           f"{expert_executor(off[0].ffn, False, True)[1]}")
        part = f" ({len(moe) - len(off)} of {len(moe)} MoE layers: {expert_executor(off[0].ffn, False, True)[1]})" \
            if off else ""
        return True, f"the {memory.kind} memory computes missed experts on the CPU where that beats copying{part}"
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
        return FUSED, f"the {memory.kind} memory moves experts between steps (no fixed experts)"
    return PROGRAM, f"every block fused and the {memory.kind} memory's experts stay in place"


__all__ = ["ArchCaps", "FLOAT", "FUSED", "FileFit", "MemoryCaps", "PACKED", "PAGE_CACHE_SHARE", "PROGRAM",
           "RuntimePlan", "Target", "decide", "default_memory_row", "experts_row", "hybrid_row"]
