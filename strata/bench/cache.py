"""`strata bench cache`: the expert placement policy replayed on a routing trace, beside the
baselines it is measured against: LRU, the best fixed hot set and Belady's optimal.

The trace and the policy's replay are `strata.memory.trace`'s (same semantics: per-layer slots,
cold start counted, the current step's experts pinned); the baselines here replay the same trace
under the same rules.

Must not print or assert: it returns data and `strata.commands.bench` prints it.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Sequence

import numpy as np

from strata.bench.predict_score import trace_scores
from strata.errors import StrataError
from strata.memory.policy import PolicyConfig
from strata.memory.trace import (ReplayConfig, ReplayResult, load_trace, n_experts_of, predictor_recall,
                                 replay_policy)


def replay_lru(indices: np.ndarray, slots: int) -> ReplayResult:
    """Least recently used, per layer."""
    return _replay_demand(indices, slots, _LruLayer)


def replay_belady(indices: np.ndarray, slots: int | Sequence[int], initial: np.ndarray | None = None,
                  n_experts: int | None = None) -> ReplayResult:
    """Belady's optimal demand policy, per layer: evict the expert whose next use is furthest
    away. Knows the future; the ceiling of any cache that loads only on a miss. `slots` may differ
    per layer; `initial` (bool [L, E]) starts each layer with those experts resident (a warm run)
    instead of empty; `extra["loads_per_layer"]` counts each layer's loads."""
    return _replay_demand(indices, slots, _BeladyLayer, initial, n_experts)


def replay_fixed(indices: np.ndarray, slots: int) -> ReplayResult:
    """The best fixed hot set: per layer, the `slots` experts most used over the whole trace,
    preloaded and never changed. An oracle (it knows the whole trace's counts)."""
    n_layers, _, _ = indices.shape
    hits = np.zeros(indices.shape, dtype=bool)
    for layer in range(n_layers):
        counts = np.bincount(indices[layer].ravel(), minlength=n_experts_of(indices))  # [E]
        hot = np.argsort(-counts, kind="stable")[:slots]
        hits[layer] = np.isin(indices[layer], hot)
    return ReplayResult(hits=hits, extra={"preloaded": slots * n_layers})


class _LruLayer:
    def __init__(self, seq: np.ndarray, n_experts: int) -> None:
        self.stamp = np.zeros(n_experts, dtype=np.int64)  # [E] time of last use

    def touch(self, t: int, j: int, expert: int) -> None:
        self.stamp[expert] = t * 1024 + j + 1

    def victim(self, candidates: np.ndarray) -> int:
        return int(candidates[np.argmin(self.stamp[candidates])])


class _BeladyLayer:
    def __init__(self, seq: np.ndarray, n_experts: int) -> None:
        self.seq = seq
        self.next_use = _next_use(seq, n_experts)  # [T, K] step of the next use of seq[t, j]
        self.when = np.zeros(n_experts, dtype=np.int64)  # [E] next use of each resident expert

    def seed(self, resident: np.ndarray) -> None:
        """Experts resident before the trace starts: next used at their first use."""
        first = np.full(len(self.when), len(self.next_use), dtype=np.int64)  # T = never
        for t in range(len(self.next_use) - 1, -1, -1):
            first[self.seq[t]] = t
        self.when[resident] = first[resident]

    def touch(self, t: int, j: int, expert: int) -> None:
        self.when[expert] = self.next_use[t, j]

    def victim(self, candidates: np.ndarray) -> int:
        return int(candidates[np.argmax(self.when[candidates])])


def _next_use(seq: np.ndarray, n_experts: int) -> np.ndarray:
    n_tokens = seq.shape[0]
    out = np.empty(seq.shape, dtype=np.int64)  # [T, K]
    upcoming = np.full(n_experts, n_tokens, dtype=np.int64)  # T = never again
    for t in range(n_tokens - 1, -1, -1):
        out[t] = upcoming[seq[t]]
        upcoming[seq[t]] = t
    return out


def _replay_demand(indices: np.ndarray, slots: int | Sequence[int], make_layer: Callable,
                   initial: np.ndarray | None = None, n_experts: int | None = None) -> ReplayResult:
    n_layers, n_tokens, _ = indices.shape
    n_experts = max(n_experts or 0, n_experts_of(indices)) if indices.size else n_experts or 1
    budgets = np.broadcast_to(np.asarray(slots, dtype=np.int64), (n_layers,))
    if initial is not None and (initial.shape != (n_layers, n_experts) or (initial.sum(1) > budgets).any()):
        raise StrataError(f"initial residency of shape {list(initial.shape)}: expected [{n_layers}, {n_experts}] "
                          f"with at most {budgets.tolist()} experts per layer")
    hits = np.zeros(indices.shape, dtype=bool)
    per_layer = np.zeros(n_layers, dtype=np.int64)
    for layer in range(n_layers):
        seq, slots = indices[layer], int(budgets[layer])  # [T, K]
        state = make_layer(seq, n_experts)
        resident = np.zeros(n_experts, dtype=bool) if initial is None else initial[layer].copy()  # [E]
        if initial is not None and isinstance(state, _BeladyLayer):
            state.seed(resident)
        n_resident = int(resident.sum())
        loads = 0
        for t in range(n_tokens):
            step = seq[t]
            hits[layer, t] = resident[step]
            for j, e in enumerate(step):
                if not resident[e]:
                    if n_resident == slots:
                        evictable = resident.copy()
                        evictable[step] = False  # the current step's experts are pinned
                        resident[state.victim(np.flatnonzero(evictable))] = False
                        n_resident -= 1
                    resident[e] = True
                    n_resident += 1
                    loads += 1
                state.touch(t, j, e)
        per_layer[layer] = loads
    return ReplayResult(hits=hits, demand_loads=int(per_layer.sum()), extra={"loads_per_layer": per_layer})



def bench_cache(path: str | Path, slots: list[int], prefetch_depth: int = 1,
                prefetch_margin: float | None = None) -> dict:
    """Hit rate (and loads per request) of the policy, with and without prefetch, beside LRU, the
    best fixed hot set and Belady's optimal, at each slot count per layer; and the predictor's
    online top-k recall for the next `max(prefetch_depth, 1)` layers."""
    indices = load_trace(path)
    n_layers, n_tokens, k = indices.shape
    n_experts = n_experts_of(indices)
    for n in slots:
        if not k <= n <= n_experts:
            raise StrataError(f"--slots {n}: each layer needs between {k} (its top-k) and {n_experts} "
                              f"(all experts) slots")
    policy = ReplayConfig().policy if prefetch_margin is None else PolicyConfig(prefetch_margin=prefetch_margin)
    depth = min(max(prefetch_depth, 1), n_layers - 1)
    result = {"trace": str(path), "layers": n_layers, "tokens": n_tokens, "top_k": k, "n_experts": n_experts,
              "prefetch_depth": prefetch_depth, "prefetch_margin": policy.prefetch_margin,
              "half_life_steps": policy.half_life_steps,
              "predictor_recall": predictor_recall(indices, depth) if n_layers > 1 else [],
              "predictor_scores": trace_scores(indices, 3) if n_layers > 1 else {}, "slots": {}}
    for n in slots:
        result["slots"][str(n)] = {
            "policy": replay_policy(indices, n, ReplayConfig(prefetch_depth, policy=policy)).summary(),
            "policy_no_prefetch": replay_policy(indices, n, ReplayConfig(0, policy=policy)).summary(),
            "lru": replay_lru(indices, n).summary(),
            "fixed": replay_fixed(indices, n).summary(),
            "belady": replay_belady(indices, n).summary(),
        }
    return result


def disk_tier(memory) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The tier of `memory` that reads the disk (the host tier of a tiered or paged memory), now:
    (slot budgets int64 [L], resident bool [L, E], bytes of one expert int64 [L]); None when the
    memory has no such tier (everything mapped or in RAM)."""
    host = memory.disk_tier
    policy = None if host is None else host.policy
    if policy is None:
        return None
    expert_bytes = np.array([sum(s.nbytes for s in host.model.expert_slabs(layer, 0)) for layer in host.layers])
    return policy.budgets.copy(), policy.page_table >= 0, expert_bytes


def optimal_disk_bytes(indices: np.ndarray, tier: tuple[np.ndarray, np.ndarray, np.ndarray]) -> int:
    """Bytes Belady's policy reads from the disk for the routing `indices` [L, T, K] with the
    tier's slot budgets, starting from its residency (`disk_tier`, taken when the trace began)."""
    budgets, resident, expert_bytes = tier
    if indices.shape[1] == 0:
        return 0
    result = replay_belady(indices.astype(np.int64), budgets, initial=resident, n_experts=resident.shape[1])
    return int((result.extra["loads_per_layer"] * expert_bytes).sum())
