"""Build a model and the runners its plan names, and run its steps with them.

    runner = build(model_file, memory, device=, dtype=, n_threads=, compute=)
    logits = runner(tokens, batch, cache)   # as Transformer.forward, through the plan's runner
    runner.plan.describe()

The plan is decided first, from the layer specs (strata.models.spec) and the memory's caps; then
the model (strata.models) is built with the executors it names, and checked to allow what the plan
expected. The model holds the maths and runs prefill itself; for decode batches the runner passes it
the plan's fast form of the blocks' loop (a decode program, or fused steps block by block). The
fast paths are built here, from the plan, and kept here.
Must not: decide (strata.runtime.plan does) or do maths of its own.
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

from strata import native
from strata.gguf import ModelFile
from strata.memory import ExpertMemory
from strata.models import Transformer, load_model
from strata.models.loader import architecture
from strata.models.spec import layer_specs
from strata.models.transformer import StepTimes

from .hybrid import HybridCompute
from .plan import FUSED, PROGRAM, ArchCaps, MemoryCaps, RuntimePlan, Target, decide
from .program import DecodeProgram
from .step import FusedDecode


def arch_caps(model: Transformer) -> ArchCaps:
    """What `model`'s layers allow the fused step and the decode program: read from its layer specs
    and the form of expert its MoE layers' executors take (`ArchCaps.of`)."""
    return _caps(model)[0]


def _caps(model: Transformer) -> tuple[ArchCaps, list[bool]]:
    experts = [b.ffn.experts for b, s in zip(model.blocks, model.specs) if s.ffn.moe]
    packed = model.compute is not None and all(e.executor.form == "packed" for e in experts)
    sharded = any(e.shard is not None for e in experts)
    return ArchCaps.of(model.specs, packed, sharded, DecodeProgram.takes)


class Runner:
    """A model and the runners of its plan: call it as the model (`Transformer.forward`)."""

    def __init__(self, model: Transformer, plan: RuntimePlan, memory: ExpertMemory | None,
                 hybrid: HybridCompute | None = None, steps: list[FusedDecode | None] | None = None,
                 program: DecodeProgram | None = None):
        self.model, self.plan, self.memory, self.hybrid = model, plan, memory, hybrid
        self.steps, self.program = steps, program
        if plan.decode == PROGRAM:
            self._decode = program
        elif plan.decode == FUSED:
            self._decode = partial(model.run_blocks, steps=steps)
        else:
            self._decode = None  # the model's own blocks

    @staticmethod
    def of(model: Transformer, plan: RuntimePlan, memory: ExpertMemory | None,
           hybrid: HybridCompute | None = None, fused: list[bool] | None = None) -> Runner:
        """The runner of `plan` over a built model: its fused steps and program made here (`fused`:
        which blocks have a fused step, as the plan was decided; None: read from the model)."""
        steps = program = None
        if plan.decode in (FUSED, PROGRAM):
            fused = _caps(model)[1] if fused is None else fused
            steps = [FusedDecode(b, spec, model.compute) if ok else None
                     for b, spec, ok in zip(model.blocks, model.specs, fused)]
        if plan.decode == PROGRAM:
            program = DecodeProgram.build(model, steps, memory.fixed)
        return Runner(model, plan, memory, hybrid, steps, program)

    def with_decode(self, decode: str) -> Runner:
        """A runner over the same model and fast paths that decodes with `decode` (one this plan
        built or a slower one): how tests compare the runners' bytes."""
        plan = replace(self.plan, decode=decode, decode_why="chosen by the caller")
        return Runner(self.model, plan, self.memory, self.hybrid, self.steps, self.program)

    def __call__(self, tokens: torch.Tensor, batch, cache, all_logits: bool = False) -> torch.Tensor:
        layers = self._decode if batch.is_decode else None
        return self.model(tokens, batch, cache, all_logits, layers=layers)

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def times(self) -> StepTimes:
        """The model's time split, with what the decode program measured inside its native call."""
        t = self.model.times()
        if self.program is not None:
            a, e = self.program.seconds()
            t.attention_s, t.experts_s = t.attention_s + a, t.experts_s + e
        return t

    def reset_times(self) -> None:
        self.model.reset_times()
        if self.program is not None:
            self.program.reset()

    def close(self) -> None:
        """Stop the hybrid CPU side's worker and the packed compute's pool (not the memory's)."""
        for part in (self.hybrid, self.model.compute):
            if part is not None:
                part.close()


def build(mf: ModelFile, memory: ExpertMemory | None, *, device: str | torch.device = "cpu",
          dtype: torch.dtype = torch.float32, n_threads: int | None = None, compute: str = "float",
          memory_why: str = "", shards=None) -> Runner:
    """The model in `mf` (`strata.models.load_model`) and the runners its plan names (`memory_why`:
    how the loader chose the memory's kind, for the plan; "": as asked; `shards`: this rank's
    `ExpertShard` of each MoE layer under expert parallelism)."""
    device, n_threads = torch.device(device), n_threads or native.default_threads()
    target, mem = Target(device.type, compute), MemoryCaps.of(memory, memory_why)
    specs = layer_specs(mf, architecture(mf))  # the plan first, from the specs; then what it names is built
    caps, fused = ArchCaps.of(specs, compute == "packed" and mem.packed, bool(shards), DecodeProgram.takes)
    plan = decide(target, mem, caps, specs)
    hybrid = HybridCompute(memory, mf, n_threads) if plan.hybrid else None
    model = None
    try:
        model = load_model(mf, memory, device=device, dtype=dtype, n_threads=n_threads, compute=compute, hybrid=hybrid,
                           shards=shards)
        built = arch_caps(model)
        if built != caps:  # the loader built other executors than the plan's rule names: a bug, said plainly
            raise RuntimeError(f"{mf.path}: the plan expected {caps}, the model built allows {built}")
        return Runner.of(model, plan, memory, hybrid, fused)
    except BaseException:
        for part in (hybrid, None if model is None else model.compute):
            if part is not None:
                part.close()
        raise


__all__ = ["Runner", "arch_caps", "build"]
