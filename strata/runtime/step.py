"""The fused decode step of packed compute: a block's attention half and router in one native
call (`native.DecodeAttn`), its routed experts in the fused MoE call, so a decode step crosses
into C about twice per layer instead of a dozen times.

A gated DeltaNet block (qwen3next, qwen35moe) has its own attention half (`FusedDeltaNet`:
`native.DecodeDeltaNet` on the batch's state slots); the gated attention is DecodeAttn's q_gate.
The maths is the block's own, step for step (strata.models: attention.py forward_native,
deltanet.py, moe.py Router and RoutedExperts, transformer.py Block), and the results are the same bytes: the per-call path stays
for prefill (several tokens per sequence) and as the reference the tests compare with.
Must not: choose when to run (the plan does: strata.runtime.plan; the runner uses it for decode
batches only) or
reach expert bytes other than through the block's RoutedExperts.
"""
from __future__ import annotations

import time

import torch

from strata import native

from strata.models.batch import Batch
from strata.models.chunked import ChunkedAttention
from strata.models.deltanet import GatedAttention, GatedDeltaNet
from strata.models.layers import FeedForward, SharedExpert
from strata.models.mla import MLAttention
from strata.models.moe import MoE
from strata.models.packed import PackedCompute, PackedMatrix


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().float().contiguous()


def _router_args(router) -> dict:
    """The native step's routing arguments of an MoE layer's router (None: a dense layer)."""
    if router is None:
        return dict(router=None, n_used=0, gating="softmax", norm_weights=False, weights_scale=1.0,
                    router_bias=None, selection_bias=None, n_groups=0, n_groups_used=0, group_top=0)
    return dict(router=router.weight, n_used=router.k, gating=router.gating, norm_weights=router.norm,
                weights_scale=router.scale, router_bias=_f32(router.bias), selection_bias=_f32(router.selection_bias),
                n_groups=router.n_groups, n_groups_used=router.n_groups_used, group_top=router.group_top)


class FusedDecode:
    """One block's decode step. Buffers are sized for `capacity` sequences and grow (once, at
    warm-up) when a larger batch arrives."""

    def __init__(self, block, compute: PackedCompute, capacity: int = 1):
        att, w = block.attention, block.attention.w
        moe = block.ffn if isinstance(block.ffn, MoE) else None
        router = moe.router if moe is not None else None
        self.block, self.compute, self.moe = block, compute, moe
        chunked = isinstance(att, ChunkedAttention)
        common = dict(
            n_embd=w.wo.shape[0], n_head=att.n_head, rope_dim=0 if chunked and att.nope else att.rope.rope_dim,
            neox=att.rope.neox,
            norm_eps=block.attention_norm.eps, attn_norm=block.attention_norm.weight, ffn_norm=block.ffn_norm.weight,
            o=(w.wo.type, w.wo._data_t), **_router_args(router))
        if isinstance(att, MLAttention):
            wq = w.wq if w.wq is not None else w.wq_b
            self.layer = native.DecodeAttn(
                **common, n_head_kv=1, head_dim=att.nope + att.rope_dim, attn_scale=att.scale,
                qkv=(wq.type, wq._data_t), mla=dict(
                    kv_lora=att.kv_lora, q_lora=0 if w.wq_a is None else w.wq_a.shape[0], nope=att.nope,
                    v_dim=att.v_dim, wkv_a=(w.wkv_a.type, w.wkv_a._data_t),
                    wq_a=None if w.wq_a is None else (w.wq_a.type, w.wq_a._data_t),
                    q_a_norm=None if w.q_a_norm is None else _f32(w.q_a_norm.weight), kv_a_norm=_f32(w.kv_a_norm.weight),
                    k_b=(w.k_b.type, w.k_b._data_t), v_b=(w.v_b.type, w.v_b._data_t)))
        else:
            bias = None
            if w.bq is not None or w.bk is not None or w.bv is not None:
                hq, hkv = att.n_head * att.head_dim, att.n_head_kv * att.head_dim
                bias = torch.cat([b if b is not None else torch.zeros(n)
                                  for b, n in ((w.bq, hq), (w.bk, hkv), (w.bv, hkv))]).float().contiguous()
            self.layer = native.DecodeAttn(
                **common, n_head_kv=att.n_head_kv, head_dim=att.head_dim, attn_scale=att.head_dim ** -0.5,
                qkv=(w.wqkv.type, w.wqkv._data_t), bqkv=bias, v=None if w.wv is None else (w.wv.type, w.wv._data_t),
                q_norm=None if w.q_norm is None else w.q_norm.weight, k_norm=None if w.k_norm is None else w.k_norm.weight,
                qk_norm_per_head=w.qk_norm_per_head, sinks=_f32(w.sinks), window=att.window, bo=_f32(w.bo),
                q_gate=isinstance(att, GatedAttention), **(dict(
                    chunk=att.chunk, qk_l2_eps=None if att.nope else att.l2_eps, temperature=att.temperature)
                    if chunked else {}))
        self._grow(capacity)

    @staticmethod
    def eligible(block, compute: PackedCompute | None) -> bool:
        """Whether packed compute can run this block's decode step fused: packed q/k/v stacked
        into one matrix (latent attention: every matrix packed) and a packed output projection, one
        norm epsilon for the layer; an MoE's router in float32 and its experts computed from
        packed memory (not the hybrid CPU/GPU split)."""
        if not getattr(block.attention, "fusable", True) or (isinstance(block.ffn, MoE) and not block.ffn.fusable):
            return False
        w = block.attention.w
        eps = block.attention_norm.eps
        if isinstance(block.attention, GatedDeltaNet):  # the stacked input projection, the conv and states native
            if compute is None or not block.attention.native or not isinstance(w.w_in, PackedMatrix) or \
                    not isinstance(w.wout, PackedMatrix):
                return False
        elif isinstance(block.attention, MLAttention):  # every matrix packed, one norm epsilon for the layer
            mats = [w.wq, w.wq_a, w.wq_b, w.wkv_a, w.wo, w.k_b, w.v_b]
            if compute is None or not all(m is None or isinstance(m, PackedMatrix) for m in mats) or \
                    (w.wq is None) == (w.wq_b is None) or any(n is not None and n.eps != eps for n in (w.q_a_norm, w.kv_a_norm)):
                return False
        elif compute is None or not isinstance(w.wqkv, PackedMatrix) or not isinstance(w.wo, PackedMatrix) or \
                (w.wv is not None and not isinstance(w.wv, PackedMatrix)) or (w.q_norm is not None and w.q_norm.eps != eps):
            return False
        if isinstance(block.ffn, MoE):
            e, r = block.ffn.experts, block.ffn.router
            return e.compute is not None and e.hybrid is None and r.weight.dtype == torch.float32 \
                and r.weight.is_contiguous() and r.weight.device.type == "cpu"
        return isinstance(block.ffn, (FeedForward, SharedExpert))  # a dense FFN (packed: as a SharedExpert)

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
        returns the distinct experts used."""
        self.layer.bind_cache(*kv)
        return self.layer.run(self.compute.pool, batch.block_table, batch.positions, *cos_sin, x, self.out,
                              self.compute.scratch)

    @staticmethod
    def of(block, compute: PackedCompute, capacity: int = 1) -> FusedDecode:
        """The fused step of an eligible block: a gated DeltaNet layer's, else an attention layer's."""
        cls = FusedDeltaNet if isinstance(block.attention, GatedDeltaNet) else FusedDecode
        return cls(block, compute, capacity)


class FusedDeltaNet(FusedDecode):
    """A gated DeltaNet block's decode step: the DeltaNet half, the FFN's norm and the router in one
    native call (`native.DecodeDeltaNet`) on the slots' states, then the MoE as FusedDecode's."""

    def __init__(self, block, compute: PackedCompute, capacity: int = 1):
        net, w = block.attention, block.attention.w
        moe = block.ffn if isinstance(block.ffn, MoE) else None
        self.block, self.compute, self.moe = block, compute, moe
        self.layer = native.DecodeDeltaNet(
            n_embd=w.wout.shape[0], n_k_heads=net.hk, n_v_heads=net.hv, head_k_dim=net.dk, head_v_dim=net.dv,
            tiled=net.tiled, ba_per_key_head=w.w_in_ba, norm_eps=block.attention_norm.eps, ssm_eps=net.eps,
            attn_norm=block.attention_norm.weight, ffn_norm=block.ffn_norm.weight, w_in=(w.w_in.type, w.w_in._data_t),
            w_out=(w.wout.type, w.wout._data_t), conv=_f32(w.conv), dt=_f32(w.dt), ssm_a=_f32(w.a),
            ssm_norm=_f32(w.norm), **_router_args(None if moe is None else moe.router))
        self._grow(capacity)

    def attention_half(self, x: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor],
                       kv: tuple[torch.Tensor, torch.Tensor]) -> int:
        """The DeltaNet half on the batch's state slots (`kv`: the layer's conv and ssm states)."""
        if batch.slots is None:
            raise ValueError(f"layer {self.block.attention.layer}: gated DeltaNet needs the batch's cache slots "
                             "(Batch.slots)")
        self.layer.bind_states(*kv)
        return self.layer.run(self.compute.pool, batch.slot_ids, batch.positions, x, self.out, self.compute.scratch)


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
    shared = moe.shared
    if shared is not None and shared.packed is not None:
        shared.add_packed(xn, routed)
    elif shared is not None:
        return x.add_(routed + shared(xn))
    return x.add_(routed)


__all__ = ["FusedDecode", "FusedDeltaNet", "add_moe"]
