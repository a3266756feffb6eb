"""The fused decode step of packed compute: a block's attention half and router in one native call
(the attention executor's `decode_layer`: its kind's `native.LayerStep`, which reads the batch's
cache blocks or, for a recurrent layer, its state slots), its routed experts in the fused MoE call, so a
decode step crosses into C about twice per layer instead of a dozen times. It is the decode
program (strata.runtime.program) of one layer, run block by block.

The maths is the block's own native executor's, step for step (strata.models.executor), and the
results are the same bytes: the executor's per-call path stays for prefill (several tokens per
sequence) and as the form the tests compare with. Which blocks have a fused step is the plan's to
say, from the layer specs (strata.runtime.plan).
Must not: choose when to run (the plan does: strata.runtime.plan; the runner uses it for decode
batches only) or reach expert bytes other than through the block's RoutedExperts.
"""
from __future__ import annotations

import time

import torch

from strata import native

from strata.models.batch import Batch
from strata.models.executor import DENSE_ROUTING
from strata.models.moe import MoE
from strata.models.packed import PackedCompute
from strata.models.spec import LayerSpec


class FusedDecode:
    """One block's decode step (a block whose spec's `unfused()` is None, under packed compute).
    Buffers are sized for `capacity` sequences and grow (once, at warm-up) when a larger batch
    arrives."""

    def __init__(self, block, spec: LayerSpec, compute: PackedCompute, capacity: int = 1):
        self.block, self.spec, self.compute = block, spec, compute
        self.moe = block.ffn if spec.ffn.moe else None
        common = dict(norm_eps=spec.norm_eps, attn_norm=block.attention_norm.weight, ffn_norm=block.ffn_norm.weight,
                      **(DENSE_ROUTING if self.moe is None else self.moe.router.decode_args()))
        self.layer = block.attention.decode_layer(common)
        self.recurrent = self.layer.state_slots  # state slots in place of a KV cache
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        out = self.out = native.StepOutputs(self.layer, capacity)
        self.routed = torch.empty((capacity, self.layer.n_embd), dtype=torch.float32)
        self.compute.reserve(self.layer.scratch_bytes(capacity))
        if self.moe is not None:
            self.moe_call = native.MoeCall(out.xn, self.routed, out.offsets, out.token_ids, out.weights_sorted,
                                           self.layer.n_experts)
            shard = self.moe.experts.shard
            if shard is not None and shard.sole is not None:  # expert parallelism: this rank's experts grouped alone
                out.group_only(shard.sole)
        self._views: dict[int, tuple] = {}  # batch size -> (xn, expert_ids, routed) views

    def views(self, B: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        v = self._views.get(B)
        if v is None:
            v = self._views[B] = (self.out.xn[:B], self.out.expert_ids[:B], self.routed[:B])
        return v

    def __call__(self, x: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor],
                 kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x [B, D] (one new token per sequence) through the block; x is updated in place and returned."""
        block, B = self.block, x.shape[0]
        t0 = time.perf_counter()
        if B > self.out.capacity:
            self._grow(B)
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()
        n_used = self.attention_half(x, batch, cos_sin, kv)
        block.clock[0] += time.perf_counter() - t0
        if block.lookahead is not None:
            block.lookahead(x)  # next layers' experts start moving; x is unchanged
        xn, expert_ids, routed = self.views(B)
        if self.moe is None:
            return x.add_(block.ffn(xn))
        shard = self.moe.experts.shard
        if shard is None:
            return add_moe(self.moe, self.moe_call, x, xn, routed, expert_ids, n_used, self.out.used)
        # expert parallelism: this rank's assignments (grouped alone by the native step, or with
        # replicated experts through the per-call path's choice of replica), then the ranks' sum
        if shard.sole is not None:
            routed.zero_()
            self.moe.experts.add_bound(self.moe_call, expert_ids, n_used, self.out.used, B)
            routed.copy_(shard.combine(routed))
        else:
            routed.copy_(self.moe.experts(xn, self.out.weights[:B], expert_ids))
        return add_moe(self.moe, None, x, xn, routed, expert_ids, n_used, self.out.used)

    def attention_half(self, x: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor],
                       kv: tuple[torch.Tensor, torch.Tensor]) -> int:
        """The native call: x += attention, then the FFN's norm and the routing into `self.out`;
        returns the distinct experts used. A recurrent layer runs on the batch's state slots (`kv`:
        the layer's states)."""
        c = self.compute
        if self.recurrent and batch.slots is None:
            raise ValueError(f"layer {self.spec.index}: a recurrent layer needs the batch's cache slots (Batch.slots)")
        self.bind(kv)
        return self.layer.run_batch(c.pool, batch, cos_sin, x, self.out, c.scratch)

    def bind(self, kv: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Bind the layer's cache (or states) for a native call that runs it (the program)."""
        self.layer.bind(*kv)


def add_moe(moe: MoE, call: native.MoeCall | None, x: torch.Tensor, xn: torch.Tensor, routed: torch.Tensor,
            expert_ids: torch.Tensor, n_used: int, used: torch.Tensor) -> torch.Tensor:
    """x [B, D] += the MoE of xn [B, D] whose routing (expert_ids [B, K], n_used distinct experts,
    grouped in `used` and the buffers `call` is bound to) is already computed: the routed experts
    into `routed` [B, D] through the expert memory (call None: `routed` holds them already), then
    the shared expert, then the residual, in the decode program's order (so every path gives the
    same bytes). Returns x."""
    if call is not None:
        routed.zero_()
        moe.experts.add_bound(call, expert_ids, n_used, used, x.shape[0])
    if moe.shared is not None:  # packed compute's shared expert (PackedSharedExpert)
        moe.shared.add_packed(xn, routed)
    return x.add_(routed)


__all__ = ["FusedDecode", "add_moe"]
