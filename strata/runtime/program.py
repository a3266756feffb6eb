"""The decode program of packed compute: a decode step through every layer in one native call
(`native.DecodeLayers`), so that once every expert stays where it is (experts read in place from
the file, or a settled slot pool) the interpreter runs once per token, not twice per layer.

Each layer is its block's fused decode step (strata.runtime.step) composed in C: the same native
functions in the same order, so the logits are the same bytes. A layer whose routing needs an
expert that is not in place yet (a settled pool still filling) hands back to Python after its
attention half: that layer's experts go through the expert memory as in the fused step (which
loads them, after which they stay), and the program resumes at the next layer.
Must not: decide placement or move experts (the memory does); run prefill (several tokens per
sequence go through the blocks).
"""
from __future__ import annotations

import torch

from strata import native
from strata.memory import FixedExperts

from strata.models.batch import Batch, KVStore
from strata.models.packed import PackedCompute
from strata.models.spec import LayerSpec

from .step import FusedDecode, add_moe


class DecodeProgram:
    """Every block of a model as one decode program. Buffers are sized for `capacity` sequences
    and grow (once, at warm-up) when a larger batch arrives."""

    def __init__(self, blocks: list, steps: list[FusedDecode], memory: FixedExperts, compute: PackedCompute,
                 fixed: list[tuple[native.MoeParts, torch.Tensor]], capacity: int = 1, alt_rope=None):
        # memory: the expert memory's `fixed` experts, which the program reads and reports its routing to
        self.blocks, self.steps, self.memory, self.compute, self.fixed = blocks, steps, memory, compute, fixed
        self.alt_rope = alt_rope  # the Rope of the layers that read the second tables, or None
        self.layers = [s.layer for s in steps]
        self.moe = [i for i, s in enumerate(steps) if s.moe is not None]  # the others: dense layers
        self._all_moe = len(self.moe) == len(blocks)
        self.model_layers = [s.spec.index if s.moe is not None else -1 for s in steps]
        self.layer_ns = torch.zeros((len(blocks), 2), dtype=torch.int64)
        self.layer_used = torch.zeros(len(blocks), dtype=torch.int64)
        self._grow(capacity)

    @staticmethod
    def takes(specs: list[LayerSpec], fused: list[bool]) -> str | None:
        """Why the program cannot run the decode steps of a model of layers `specs` (None: it can):
        it needs every block fused (`fused[i]`: block i has a fused decode step) and at least one
        MoE block; sliding-window layers with a RoPE of their own (base, rotary features, scaling)
        read the program's second pair of tables. (Under packed compute a dense FFN and a shared
        expert are one packed expert each, the program's form; look-ahead announcements, Python
        between layers, are the plan's to rule out.)"""
        if not any(s.ffn.moe for s in specs):
            return "no block has routed experts"
        if not all(fused):
            return f"block {fused.index(False)} has no fused decode step"
        return None

    @staticmethod
    def build(model, steps: list[FusedDecode], memory: FixedExperts) -> DecodeProgram:
        """The program of `model` (`takes` said yes) over the expert memory's `fixed` experts
        (`fixed_packed` of every MoE layer)."""
        fixed = [memory.fixed_packed(s.spec.index) if s.moe is not None else (None, None) for s in steps]
        alt = None  # the second rope (sliding-window layers' own RoPE): its layers read the second tables
        for s in (s for s in steps if s.spec.attention.own_rope):
            rope = s.block.attention.rope
            if rope is not model.rope:
                if alt is not None and rope is not alt:
                    raise ValueError("decode program: more than two RoPE tables among the layers")
                alt = rope
                s.layer.use_alt_rope()
        return DecodeProgram(list(model.blocks), steps, memory, model.compute, fixed, alt_rope=alt)

    def _grow(self, capacity: int) -> None:
        first = self.layers[self.moe[0]]
        out = self.out = native.StepOutputs(first, capacity)
        self.routed = torch.empty((capacity, first.n_embd), dtype=torch.float32)
        self.expert_ids = torch.empty((len(self.layers), capacity, max(first.n_used, 1)), dtype=torch.int64)
        for layer in self.layers:
            self.compute.reserve(layer.scratch_bytes(capacity))
        self.native = native.DecodeLayers([
            (step.layer, parts, slot_of, self._shared(step), None if step.moe is None else step.moe.experts.executor.act)
            for step, (parts, slot_of) in zip(self.steps, self.fixed)], out)
        self.moe_call = native.MoeCall(out.xn, self.routed, out.offsets, out.token_ids, out.weights_sorted,
                                       first.n_experts)

    @staticmethod
    def _shared(step: FusedDecode) -> tuple | None:
        """The block's shared expert as the native program takes it: (parts, gate [D] or None);
        a dense layer's FFN is one (a PackedSharedExpert), without gate."""
        shared = step.block.ffn if step.moe is None else step.moe.shared
        return None if shared is None else (shared.parts, shared.gate)

    def seconds(self) -> tuple[float, float]:
        """Seconds in attention and in routed experts since the last `reset`."""
        ns = self.layer_ns.sum(0).tolist()
        return ns[0] * 1e-9, ns[1] * 1e-9

    def reset(self) -> None:
        self.layer_ns.zero_()

    def __call__(self, x: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor],
                 cache: KVStore) -> torch.Tensor:
        """x [B, D] (one new token per sequence) through every block; returns the result (x itself
        when it was contiguous float32, updated in place)."""
        B = x.shape[0]
        if B > self.out.capacity:
            self._grow(B)
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()
        for i, step in enumerate(self.steps):
            step.bind(cache.layer(i))
        slots = batch.slot_ids if self.native.recurrent else None  # the batch's state rows
        alt = None if self.alt_rope is None else self.alt_rope.cos_sin(batch.positions, x.dtype, batch.upto)
        self.memory.check_fixed()
        c, n, first = self.compute, len(self.layers), 0
        while True:
            stop = self.native.run(c.pool, batch.block_table, batch.positions, *cos_sin, x, self.routed, self.expert_ids,
                                   self.layer_used, c.scratch, first, self.layer_ns, slots, alt=alt)
            if self.memory.counts_routing and stop > first:
                if self._all_moe:
                    self.memory.served_fixed_layers(self.model_layers[first:stop], self.expert_ids[first:stop, :B],
                                                    self.layer_used[first:stop].tolist())
                else:
                    ran = [i for i in self.moe if first <= i < stop]
                    if ran:
                        self.memory.served_fixed_layers([self.model_layers[i] for i in ran], self.expert_ids[ran, :B],
                                                        self.layer_used[ran].tolist())
            if stop == n:
                return x
            # layer `stop` routed to an expert not in place: its experts through the memory
            add_moe(self.blocks[stop].ffn, self.moe_call, x, self.out.xn[:B], self.routed[:B],
                    self.expert_ids[stop, :B], int(self.layer_used[stop]), self.out.used)
            first = stop + 1


__all__ = ["DecodeProgram"]
