"""Routing traces and their replay through the expert placement policy (the baselines it is
measured against, LRU, the best fixed hot set and Belady's optimal, are in `strata.bench.cache`).

A trace (`np.load`, format of `shared/traces/`) holds `indices` int16 [L, T, K]: the K experts
chosen at each of L layers for each of T tokens. Replay decodes it token by token, layer by
layer; one (token, layer) is one step, whose K experts are requested in order. Every cache has
`slots` slots per layer and starts empty (cold start counted), except the fixed hot set, which is
preloaded. The experts of the current step are all protected while it runs (the engine pins them
for the grouped expert compute), so a miss never evicts an expert the same step needs.
hit rate = hits / requests over all layers. These semantics reproduce the trace README's table.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from strata.errors import StrataError, StrataFormatError
from strata.memory.policy import ExpertPolicy, PolicyConfig
from strata.memory.predictor import CooccurrencePredictor


def load_trace(path: str | Path) -> np.ndarray:
    """The `indices` array of a routing trace file, as int64 [L, T, K], checked."""
    try:
        with np.load(path) as data:
            if "indices" not in data.files:
                raise StrataFormatError(f"{path}: routing trace has no 'indices' array (found {data.files})")
            indices = data["indices"]
    except (OSError, ValueError) as exc:
        raise StrataFormatError(f"{path}: not a readable .npz routing trace ({exc})") from exc
    if indices.ndim != 3 or not np.issubdtype(indices.dtype, np.integer) or indices.size == 0:
        raise StrataFormatError(f"{path}: 'indices' should be integer [layers, tokens, k], found "
                                f"{indices.dtype} {list(indices.shape)}")
    if indices.min() < 0:
        raise StrataFormatError(f"{path}: 'indices' holds negative expert id {int(indices.min())}")
    repeats = np.argwhere((np.diff(np.sort(indices, axis=-1), axis=-1) == 0).any(axis=-1))  # [n, 2]
    if len(repeats):
        layer, token = repeats[0]
        raise StrataFormatError(f"{path}: token {token} at layer {layer} chose an expert twice "
                                f"({indices[layer, token].tolist()}); a step's k experts are distinct")
    return indices.astype(np.int64)


@dataclass
class ReplayResult:
    """Counts of one replay. `hits` [L, T, K] marks each request served from the cache."""

    hits: np.ndarray  # [L, T, K] bool
    demand_loads: int = 0
    prefetch_loads: int = 0
    prefetch_used: int = 0  # prefetched experts requested before being evicted
    extra: dict = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return int(self.hits.size)

    @property
    def hit_rate(self) -> float:
        return float(self.hits.mean())

    def summary(self) -> dict[str, float]:
        out = {"hit_rate": self.hit_rate,
               "loads_per_request": (self.demand_loads + self.prefetch_loads) / self.requests}
        if self.prefetch_loads:
            out["prefetch_precision"] = self.prefetch_used / self.prefetch_loads
            out["prefetch_recall"] = self.prefetch_used / self.requests
        return out


def n_experts_of(indices: np.ndarray) -> int:
    return int(indices.max()) + 1


# ---- the policy --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReplayConfig:
    """How the replay drives the policy: prefetch depth (0: hints and prefetch off) and how many
    predicted experts per predicted layer it hints and may prefetch (0: top-k)."""

    prefetch_depth: int = 1
    prefetch_top: int = 0
    predictor_half_life: float | None = None
    policy: PolicyConfig = PolicyConfig()


def replay_policy(indices: np.ndarray, slots: int, config: ReplayConfig = ReplayConfig(),
                  n_experts: int | None = None,
                  on_step: Callable[[int, int, ExpertPolicy], None] | None = None) -> ReplayResult:
    """Replay through `ExpertPolicy`, with the co-occurrence predictor's hints and prefetches for
    the next `prefetch_depth` layers of the same token. Predictions use only past tokens and the
    current token's earlier layers. `on_step(token, layer, policy)` runs after every step."""
    n_layers, n_tokens, k = indices.shape
    n_experts = n_experts or n_experts_of(indices)
    policy = ExpertPolicy(n_layers, n_experts, slots, top_k=k, config=config.policy)
    predictor = CooccurrencePredictor(n_layers, n_experts, k, half_life_tokens=config.predictor_half_life)
    run = _PolicyRun(policy, predictor, config, np.zeros(indices.shape, dtype=bool))
    for t in range(n_tokens):
        for layer in range(n_layers):
            run.step(t, layer, indices[layer, t])
            if on_step is not None:
                on_step(t, layer, policy)
    return ReplayResult(hits=run.hits, demand_loads=run.demand_loads, prefetch_loads=run.prefetch_loads,
                        prefetch_used=run.prefetch_used)


class _PolicyRun:
    """The engine's side of the policy during replay: acquire, record, hint, prefetch."""

    def __init__(self, policy: ExpertPolicy, predictor: CooccurrencePredictor, config: ReplayConfig,
                 hits: np.ndarray) -> None:
        self.policy, self.predictor, self.config, self.hits = policy, predictor, config, hits
        self.prefetched = np.zeros(policy.page_table.shape, dtype=bool)  # [L, E] loaded, not yet used
        self.demand_loads = self.prefetch_loads = self.prefetch_used = 0

    def step(self, t: int, layer: int, expert_ids: np.ndarray) -> None:
        self.policy.record(layer, expert_ids)
        self.hits[layer, t] = self._acquire(layer, expert_ids)
        for e in expert_ids:
            self.policy.unpin(layer, e)
        self.predictor.observe(layer, expert_ids)
        if self.config.prefetch_depth > 0:
            self._prefetch(layer, expert_ids)

    def _acquire(self, layer: int, expert_ids: np.ndarray) -> np.ndarray:
        policy = self.policy
        hit = np.array([policy.lookup(layer, e) is not None for e in expert_ids])  # [K]
        for e in expert_ids[hit]:  # pin the hits first so this step's misses cannot evict them
            policy.pin(layer, e)
        self.prefetch_used += int(self.prefetched[layer, expert_ids].sum())
        self.prefetched[layer, expert_ids] = False
        for e in expert_ids[~hit]:
            self._load(layer, e, policy.admit(layer, e))
            policy.pin(layer, e)
            self.demand_loads += 1
        return hit

    def _prefetch(self, layer: int, expert_ids: np.ndarray) -> None:
        top = self.config.prefetch_top or self.predictor.top_k
        for nxt, ids, probs in self.predictor.predict(layer, expert_ids, self.config.prefetch_depth, top):
            self.policy.hint(nxt, ids, probs)
            for e, p in zip(ids, probs):
                if self.policy.lookup(nxt, e) is None:
                    admitted = self.policy.admit_prefetch(nxt, e, p)
                    if admitted is None:
                        break  # candidates come most likely first: the rest would be refused too
                    self._load(nxt, e, admitted)
                    self.prefetched[nxt, e] = True
                    self.prefetch_loads += 1

    def _load(self, layer: int, expert: int, admitted: tuple[int, int | None]) -> None:
        _, evicted = admitted
        if evicted is not None:
            self.prefetched[layer, evicted] = False
        self.policy.complete(layer, expert)  # replay loads are instantaneous


# ---- the predictor on its own ------------------------------------------------------------------

def predictor_recall(indices: np.ndarray, depth: int = 1, half_life: float | None = None,
                     fit_tokens: int = 0) -> list[float]:
    """Top-k recall of the co-occurrence predictor at distances 1..depth (precision equals recall:
    k predicted against k chosen). Online (fit_tokens=0): each token is predicted from the past
    only, then learnt. Else fit on the first fit_tokens tokens and test on the rest, frozen."""
    n_layers, n_tokens, k = indices.shape
    if depth < 1 or n_layers <= depth:
        raise StrataError(f"predictor recall: depth {depth} needs more than {depth} layers, trace has {n_layers}")
    predictor = CooccurrencePredictor(n_layers, n_experts_of(indices), k, half_life_tokens=half_life)
    found = np.zeros(depth, dtype=np.int64)
    asked = np.zeros(depth, dtype=np.int64)
    for t in range(n_tokens):
        learn, test = (True, True) if not fit_tokens else (t < fit_tokens, t >= fit_tokens)
        for layer in range(n_layers):
            ids = indices[layer, t]
            if test:
                for nxt, pred, _ in predictor.predict(layer, ids, depth):
                    found[nxt - layer - 1] += np.isin(indices[nxt, t], pred).sum()
                    asked[nxt - layer - 1] += k
            if learn:
                predictor.observe(layer, ids)
    return list(found / np.maximum(asked, 1))
