"""The sparse MoE feed-forward: router, grouped routed-expert compute, optional shared expert.

Router: probabilities from the router logits (softmax, or sigmoid for DeepSeek-V3-style
gating), the top-k experts per token, their weights renormalised to sum to one when the model
says so, then multiplied by `expert_weights_scale`. Probabilities are computed in float32.

The layer in four parts: the router; the dispatch (`ExpertShard`, under expert parallelism: this
rank's assignments only); an expert executor, which declares the form of expert it needs from the
memory (`FloatExperts` and `HybridExperts` here, float; `strata.models.executor.PackedExperts`,
packed); the combine (the ranks' partial sums, then the shared expert), in `RoutedExperts` and `MoE`.

Grouped compute: the T*K (token, expert) assignments are sorted by expert, so each chosen expert
runs once over all of its tokens (one [Te, D] x [D, I] pass instead of Te vectors). Experts are
reached only through `ExpertMemory`, in chunks of at most `memory.max_acquire`, in ascending
expert order; each expert's contribution is added with its router weight.

Look-ahead: a block may announce the next layers' experts to the memory (`Lookahead`) so their
loads overlap this layer's compute; announcements never change what is computed.
"""
from __future__ import annotations

import time
from itertools import accumulate

import torch
import torch.nn.functional as F
from torch import nn

from strata.memory import ExpertMemory, Prefetcher

from .layers import SharedExpert, swiglu
from .shard import ExpertShard


class Router(nn.Module):
    """Top-k experts per token and their weights. Optional parts (DeepSeek-V3, gpt-oss):
    `bias` [E] added to the logits; `selection_bias` [E] added to the probabilities for choosing
    only (the weights stay the unbiased probabilities); expert groups, where only the
    `n_groups_used` groups with the largest score compete (`group_score` "top2": the sum of their
    top-2 (biased) probabilities, DeepSeek-V3 and llama.cpp; "max": their best one, DeepSeek-V2);
    gating "softmax_weight": top-k of the logits, softmax over the chosen k."""

    def __init__(self, weight: torch.Tensor, n_experts_used: int, gating: str, norm: bool, scale: float,
                 bias: torch.Tensor | None = None, selection_bias: torch.Tensor | None = None,
                 n_groups: int = 0, n_groups_used: int = 0, group_score: str = "top2"):
        super().__init__()
        if gating not in ("softmax", "sigmoid", "softmax_weight"):
            raise ValueError(f"expert gating function {gating!r} is not supported "
                             "(expected softmax, sigmoid or softmax_weight)")
        self.weight, self.k, self.gating, self.norm, self.scale = weight, n_experts_used, gating, norm, scale  # [E, D]
        self.bias, self.selection_bias = bias, selection_bias  # [E], [E]
        self.n_groups, self.n_groups_used = (n_groups, n_groups_used) if 1 < n_groups and n_groups_used < n_groups \
            else (0, 0)
        if group_score not in ("top2", "max"):
            raise ValueError(f"expert group score {group_score!r} is not supported (expected top2 or max)")
        self.group_score = group_score

    @property
    def group_top(self) -> int:
        """The ranks a group's score sums (no more than a group holds); 0 without groups."""
        return min(2 if self.group_score == "top2" else 1, self.weight.shape[0] // self.n_groups) if self.n_groups else 0

    @property
    def plain(self) -> bool:
        """Whether the native routing call computes this router: softmax, sigmoid or a softmax over
        the top k logits, a bias on the logits (gpt-oss), a selection bias and expert groups
        (DeepSeek); groups beside softmax_weight are torch's only."""
        return not (self.n_groups and self.gating == "softmax_weight")

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The logits [T, E] the torch path routes on (the bias added)."""
        logits = F.linear(x, self.weight).float()  # [T, E]
        return logits if self.bias is None else logits + self.bias

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """Top-k expert ids [T, K] for `logits` [T, E] as the gating and selection bias choose them,
        expert groups left out: a prediction's choice (`Lookahead`), not the routing's."""
        if self.selection_bias is None:
            return logits.topk(self.k, dim=-1).indices  # softmax and sigmoid keep the order
        probs = logits.softmax(dim=-1) if self.gating == "softmax" else logits.sigmoid()
        return (probs + self.selection_bias).topk(self.k, dim=-1).indices

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.logits(x)  # [T, E]
        if self.gating == "softmax_weight":
            top, expert_ids = logits.topk(self.k, dim=-1)  # [T, K]
            weights = top.softmax(dim=-1)
        else:
            probs = logits.softmax(dim=-1) if self.gating == "softmax" else logits.sigmoid()  # [T, E]
            choice = probs if self.selection_bias is None else probs + self.selection_bias
            if self.n_groups:
                choice = self._mask_groups(choice)
            expert_ids = choice.topk(self.k, dim=-1)[1]  # [T, K]
            weights = probs.gather(1, expert_ids)  # [T, K]
        if self.norm:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.scale != 1.0:
            weights = weights * self.scale
        return weights.to(x.dtype), expert_ids

    def _mask_groups(self, choice: torch.Tensor) -> torch.Tensor:
        T, E = choice.shape
        groups = choice.view(T, self.n_groups, E // self.n_groups)  # [T, G, E/G]
        top = 2 if self.group_score == "top2" else 1
        group_scores = groups.topk(min(top, E // self.n_groups), dim=-1)[0].sum(dim=-1)  # [T, G]
        keep = group_scores.topk(self.n_groups_used, dim=-1)[1]  # [T, Gu]
        mask = torch.ones_like(group_scores, dtype=torch.bool).scatter_(1, keep, False)  # [T, G]: groups dropped
        return groups.masked_fill(mask[..., None], float("-inf")).view(T, E)


class ExpertExecutor:
    """What computes a layer's routed experts of its tokens: called with x [T, D], weights [T, K]
    and expert_ids [T, K], returns [T, D] (this rank's share under expert parallelism, `shard`).
    `form`: the form of expert it takes from the memory (`ExpertMemory.form`: what its `start`
    hands out)."""

    form = "float"

    def __init__(self, memory: ExpertMemory, layer: int, n_experts: int, expert_fn=None,
                 shard: ExpertShard | None = None):
        self.memory, self.layer, self.n_experts, self.shard = memory, layer, n_experts, shard
        self.expert_fn = expert_fn  # ClampedSwiGLU (gpt-oss), InputScaled (Llama 4) or None: plain SwiGLU

    def __call__(self, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class FloatExperts(ExpertExecutor):
    """Each expert acquired as float weights and run as one GEMM over its tokens."""

    def __call__(self, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        K, memory = expert_ids.shape[1], self.memory
        if self.shard is not None:  # other ranks' assignments to a bucket past the last expert, not computed
            expert_ids = self.shard.others_to(expert_ids, self.n_experts)
        flat = expert_ids.flatten()  # [T*K]
        order = flat.argsort(stable=True)  # assignments grouped by expert, tokens ascending within
        bounds = [0, *accumulate(torch.bincount(flat).tolist())]  # expert e owns order[bounds[e]:bounds[e+1]]
        n = len(bounds) - 1 if self.shard is None else min(len(bounds) - 1, self.n_experts)
        used = [e for e in range(n) if bounds[e + 1] > bounds[e]]
        out = torch.zeros_like(x)  # [T, D]
        w_flat = weights.flatten()  # [T*K]
        for i in range(0, len(used), memory.max_acquire):
            chunk = used[i:i + memory.max_acquire]
            spans = [(bounds[e], bounds[e + 1]) for e in chunk]
            float_experts(memory, self.layer, chunk, spans, order, K, x, w_flat, out, self.expert_fn)
        return out


class HybridExperts(ExpertExecutor):
    """Plain (or input-scaled) SwiGLU experts through hybrid compute: `split` (the runtime's CPU side,
    strata.runtime.hybrid) divides each chunk between the device and the CPU."""

    def __init__(self, memory: ExpertMemory, layer: int, n_experts: int, split, expert_fn=None):
        super().__init__(memory, layer, n_experts, expert_fn)
        self.split = split
        self.input_scaled = expert_fn is not None and expert_fn.input_scaled

    def __call__(self, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        if not self.input_scaled:
            return self.split(self.memory, self.layer, x, weights, expert_ids)
        T, K = expert_ids.shape  # each assignment a token of its own (row t*K + j), its input scaled
        picks = (x[:, None, :] * weights[:, :, None].to(x.dtype)).reshape(T * K, -1)  # [T*K, D]
        ones = torch.ones((T * K, 1), dtype=weights.dtype, device=x.device)
        return self.split(self.memory, self.layer, picks, ones, expert_ids.reshape(T * K, 1)).view(T, K, -1).sum(1)


class RoutedExperts(nn.Module):
    """The routed-expert stage of one layer: the routing reported to the memory, the executor's
    experts (`executor`, chosen at load from the layer spec: `strata.models.spec.expert_executor`),
    the ranks' partial sums combined under expert parallelism (`shard`: the one place the layer's
    routed outputs meet), and the time it took."""

    def __init__(self, executor: ExpertExecutor):
        super().__init__()
        self.executor = executor
        self.memory, self.layer, self.shard = executor.memory, executor.layer, executor.shard
        self._seconds = [0.0]  # time in this layer's routed experts, waits for the memory included (a list:
        # a float attribute of a Module is set through Module.__setattr__, microseconds a call)

    @property
    def seconds(self) -> float:
        return self._seconds[0]

    @seconds.setter
    def seconds(self, value: float) -> None:
        self._seconds[0] = value

    def forward(self, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        self.memory.observe(self.layer, expert_ids)
        out = self.executor(x, weights, expert_ids)
        self._seconds[0] += time.perf_counter() - t0
        return out if self.shard is None else self.shard.combine(out)

    def add_bound(self, call, expert_ids: torch.Tensor, n_used: int, used: torch.Tensor, n_tokens: int) -> None:
        """The fused decode step's form (packed executor): `call` (native.MoeCall) is bound to the
        step's buffers, where the routing of n_tokens tokens (expert_ids [T, K]) is already grouped by
        expert (used, and the offsets, token ids and weights `call` reads); adds the routed experts
        into its output."""
        t0 = time.perf_counter()
        self.memory.observe(self.layer, expert_ids)
        self.executor.held(call, n_used, used, n_tokens)
        self._seconds[0] += time.perf_counter() - t0


def float_experts(memory: ExpertMemory, layer: int, expert_ids: list[int], spans: list[tuple[int, int]],
                  order: torch.Tensor, K: int, x: torch.Tensor, w_flat: torch.Tensor, out: torch.Tensor,
                  expert_fn=None) -> None:
    """Acquire `expert_ids` of `layer` as float weights, run each as one SwiGLU GEMM (or
    `expert_fn(x, gate, up, down, e)`) over its assignments order[lo:hi] (indices into the T*K
    routing; token = index // K), add the results weighted by w_flat [T*K] into out [T, D] (an
    input-scaled function: the weights scale the inputs and the results add as they are), release."""
    acquired = memory.start(layer, expert_ids)  # float form: every expert, nothing left to finish
    scaled = expert_fn is not None and expert_fn.input_scaled
    try:
        for (lo, hi), w, e in zip(spans, acquired, expert_ids):
            picks = order[lo:hi]  # [Te] indices into T*K
            tokens = picks // K  # [Te]
            xe, we = x[tokens], w_flat[picks, None]  # [Te, D], [Te, 1]
            if scaled:  # the weight scales the input; the output is added as it is
                xe, we = xe * we.to(x.dtype), None
            y = swiglu(xe, w.gate, w.up, w.down) if expert_fn is None else \
                expert_fn(xe, w.gate, w.up, w.down, e)  # [Te, D]
            out.index_add_(0, tokens, y if we is None else y * we)
    finally:  # an interrupted step must not leave the experts held
        memory.release(layer, expert_ids)


class Lookahead:
    """Announces the routed experts of the next layers before they are needed: each next MoE
    layer's own FFN norm and router applied to the current hidden state (the residual stream
    changes little from one layer to the next), top-k per token, passed to `prefetcher.prefetch`
    (what an announcement means to the memory: `strata.memory.predict.lookahead`). With a
    `correction` (`strata.memory.predict.correction`), the routers' logits go through its learned
    map first; `own` (the source block's FFN norm and router, None where it has none) gives it the
    logits the source layer routes on. `owned` (expert parallelism): per target layer, the experts
    this rank holds (bool [E]); the others' are not announced. A hint only: it reads h and changes
    nothing the model computes."""

    def __init__(self, prefetcher: Prefetcher, targets: list[tuple[int, nn.Module, Router]], source: int = -1,
                 correction=None, own: tuple[nn.Module, Router] | None = None,
                 owned: dict[int, torch.Tensor] | None = None):
        self.prefetcher, self.targets = prefetcher, targets  # (layer, ffn_norm, router) of each next MoE layer
        self.source = source  # the block whose hidden state this reads (-1: the embeddings), for scoring
        self.correction, self.own, self.owned = correction, own, owned or {}

    def __call__(self, h: torch.Tensor) -> None:
        for layer, expert_ids in self.predict(h):
            ids = expert_ids.unique()
            if layer in self.owned:
                ids = ids[self.owned[layer][ids.cpu()]]
            if ids.numel():
                self.prefetcher.prefetch(layer, ids.tolist(), source=self.source)

    def predict(self, h: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """(layer, expert ids [T, K]) of each next MoE layer's router applied to h [T, D]."""
        if self.correction is None:
            return [(layer, router(norm(h))[1]) for layer, norm, router in self.targets]
        own = None if self.own is None else self.own[1].logits(self.own[0](h)).cpu().numpy()  # [T, E]
        base = {layer: router.logits(norm(h)).cpu().numpy() for layer, norm, router in self.targets}
        out = self.correction.step(self.source, own, base)  # {layer: [T, E]} float64
        return [(layer, router.choose(torch.from_numpy(out[layer]))) for layer, _, router in self.targets]


class MoE(nn.Module):
    def __init__(self, router: Router, experts: RoutedExperts, shared: SharedExpert | None):
        super().__init__()
        self.router, self.experts, self.shared = router, experts, shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = self.router(x)  # [T, K], [T, K]
        out = self.experts(x, weights, expert_ids)  # [T, D]
        return out if self.shared is None else out + self.shared(x)


__all__ = ["ExpertExecutor", "FloatExperts", "HybridExperts", "Lookahead", "MoE", "Router", "RoutedExperts",
           "float_experts"]
