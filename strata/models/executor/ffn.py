"""The native executor of the feed-forward half and the norms: packed compute on the CPU, float32,
any number of tokens. `NativeNorm`: RMSNorm in one native call; `NativeRouter`: the router's logits,
top-k and weights in two native calls (the fused decode step's routing); `PackedSharedExpert`: a
shared expert or a dense FFN as a one-expert fused MoE call (the decode program's own form, so
every path gives the same bytes); `PackedExperts`: the routed experts' executor over a memory that
hands out packed experts, one fused native call per chunk of held experts.
Must not: reach expert bytes other than through the expert memory.
"""
from __future__ import annotations

import torch

from strata import native

from ..layers import FeedForward, RMSNorm, SharedExpert
from ..moe import ExpertExecutor, Router
from ..packed import PackedCompute
from .attention import f32


class NativeNorm(RMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return native.rmsnorm(x, self.weight, self.eps, torch.empty(x.shape, dtype=torch.float32))


class NativeRouter(Router):
    """The router in native calls where they compute it (the layer spec's `unfused()` is None),
    torch's otherwise (expert groups beside softmax_weight)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.plain:
            return super().forward(x)
        T, E = x.shape[0], self.weight.shape[0]
        logits = native.matvec(x, self.weight, torch.empty((T, E), dtype=torch.float32))  # [T, E]
        if self.bias is not None:
            logits += self.bias  # float32, as the fused decode step adds it
        weights = torch.empty((T, self.k), dtype=torch.float32)  # [T, K]
        expert_ids = torch.empty((T, self.k), dtype=torch.int64)  # [T, K]
        native.route(logits, self.k, self.gating, self.norm, self.scale, expert_ids, weights, self.selection_bias,
                     self.n_groups, self.n_groups_used, self.group_top)
        return weights, expert_ids

    def decode_args(self) -> dict:
        """The native decode step's routing arguments of this router."""
        return dict(router=self.weight, n_used=self.k, gating=self.gating, norm_weights=self.norm,
                    weights_scale=self.scale, router_bias=f32(self.bias), selection_bias=f32(self.selection_bias),
                    n_groups=self.n_groups, n_groups_used=self.n_groups_used, group_top=self.group_top)


#: The native decode step's routing arguments of a dense layer (no router).
DENSE_ROUTING = dict(router=None, n_used=0, gating="softmax", norm_weights=False, weights_scale=1.0, router_bias=None,
                     selection_bias=None, n_groups=0, n_groups_used=0, group_top=0)


class PackedSharedExpert(SharedExpert):
    """A shared expert (or a dense FFN: no gate) of three packed matrices, run as a one-expert fused
    MoE call: `parts` (native.MoeParts holding it) and `gate` [D] float32 or None."""

    def __init__(self, ffn: FeedForward, gate_inp: torch.Tensor | None, compute: PackedCompute):
        super().__init__(ffn, gate_inp)
        mats = (ffn.gate, ffn.up, ffn.down)
        self.parts = native.MoeParts(*(native.MoePart(m._data_t, m.type, *m.shape) for m in mats))
        self.compute, T = compute, compute.max_tokens
        compute.reserve(native.moe_scratch_bytes(self.parts, T, T))
        self.gate = None if gate_inp is None else gate_inp.float().contiguous()
        self._bufs = (torch.zeros(1, dtype=torch.int32), torch.empty(2, dtype=torch.int64),
                      torch.arange(T, dtype=torch.int32), torch.empty(T, dtype=torch.float32))

    def add_packed(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out [T, D] float32 += this expert of x [T, D] float32 (contiguous), weighted per token."""
        index, offsets, tokens, weights = self._bufs
        c, step = self.compute, self.compute.max_tokens
        for t0 in range(0, x.shape[0], step):
            xs, n = x[t0:t0 + step], min(step, x.shape[0] - t0)
            native.shared_weights(xs, self.gate, weights[:n])
            offsets[0], offsets[1] = 0, n
            native.moe_swiglu(c.pool, xs, out[t0:t0 + n], self.parts, index, offsets, tokens[:n], weights[:n],
                              c.scratch)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float().contiguous()
        return self.add_packed(x, torch.zeros(x.shape, dtype=torch.float32))


class PackedExperts(ExpertExecutor):
    """Routed experts from a memory that hands them out packed (`form` "packed"): the assignments
    grouped by expert (this rank's alone under expert parallelism), then one fused native call per
    chunk of at most `memory.max_acquire` held experts runs gate, up, the expert function, down and
    the weighted sum from the file's blocks."""

    form = "packed"

    def __init__(self, memory, layer: int, n_experts: int, compute: PackedCompute, expert_fn=None, shard=None):
        super().__init__(memory, layer, n_experts, expert_fn, shard)
        self.compute = compute

    @property
    def act(self):
        """The expert function as the fused call computes it (native.MoeAct; None: plain SwiGLU)."""
        return None if self.expert_fn is None else self.expert_fn.native()

    def __call__(self, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape, dtype=torch.float32)  # [T, D]
        x = x.float().contiguous()
        step = self.compute.max_tokens  # the scratch holds this many tokens' activations
        for t0 in range(0, x.shape[0], step):
            t1 = t0 + step
            self._tokens(x[t0:t1], out[t0:t1], weights[t0:t1], expert_ids[t0:t1])
        return out.to(weights.dtype)

    def _tokens(self, x: torch.Tensor, out: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor) -> None:
        T, K = expert_ids.shape
        E, shard = self.n_experts, self.shard
        sole = None if shard is None else shard.sole  # this rank's experts alone grouped
        if shard is not None and sole is None:  # other ranks' assignments to bucket E, dropped after the grouping
            expert_ids, E = shard.others_to(expert_ids, E), E + 1
        used = torch.empty(E, dtype=torch.int32)
        offsets = torch.empty(E + 1, dtype=torch.int64)  # expert used[j] owns offsets[j]:offsets[j+1]
        token_ids = torch.empty(T * K, dtype=torch.int32)
        router_w = torch.empty(T * K, dtype=torch.float32)
        n_used = native.group_assignments(expert_ids.contiguous(), weights.float().contiguous(), E, used, offsets,
                                          token_ids, router_w, sole)
        if shard is not None and sole is None and n_used and int(used[n_used - 1]) == self.n_experts:
            n_used -= 1
        self.held(native.MoeCall(x, out, offsets, token_ids, router_w, E), n_used, used, T)

    def held(self, call: native.MoeCall, n_used: int, used: torch.Tensor, n_tokens: int) -> None:
        """Run `call` over the used experts in chunks of at most `memory.max_acquire`, each chunk
        started (what is in place), finished (what was still being read) and released."""
        act = self.act
        if call.act is not act:  # a call shared by layers computes each layer's own expert function
            call.bind_act(act, used)
        used_ids = used[:n_used].tolist()
        memory, layer = self.memory, self.layer
        n, pool, scratch = memory.max_acquire, self.compute.pool, self.compute.scratch
        for i in range(0, n_used, n):
            chunk = used_ids[i:i + n]
            held = memory.start(layer, chunk)
            try:
                if min(held.index) >= 0:
                    call(pool, held.parts, held.index, i, n_tokens, scratch)
                    continue
                if held.stand_in is not None:  # misses computed from their low-bit stand-ins, nothing waited for
                    call.rows(pool, held.parts, held.index, i, n_tokens, scratch)
                    call.rows(pool, held.stand_in, held.stand_in_index, i, n_tokens, scratch)
                    call.reduce(i, len(chunk), n_tokens)
                    continue
                # Some experts are still being read: compute the others meanwhile (their rows, not
                # yet summed), then the rest, then the sum in the order one call would make it.
                call.rows(pool, held.parts, held.index, i, n_tokens, scratch)
                done = memory.finish(layer, chunk)
                call.rows(pool, done.parts, [s if h < 0 else -1 for s, h in zip(done.index, held.index)], i, n_tokens,
                          scratch)
                call.reduce(i, len(chunk), n_tokens)
            finally:  # an interrupted step must not leave the experts held
                memory.release(layer, chunk)


__all__ = ["DENSE_ROUTING", "NativeNorm", "NativeRouter", "PackedExperts", "PackedSharedExpert"]
