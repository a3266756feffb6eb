"""Routing traces and their replay through the expert placement policy (the baselines it is
measured against, LRU, the best fixed hot set and Belady's optimal, are in `strata.bench.cache`).

A trace (`np.load`, format of `shared/traces/`) holds `indices` int16 [L, T, K]: the K experts
chosen at each of L layers for each of T tokens. Replay decodes it token by token, layer by
layer; one (token, layer) is one step, whose K experts are requested in order. Every cache has
`slots` slots per layer and starts empty (cold start counted), except the fixed hot set, which is
preloaded. The experts of the current step are all protected while it runs (the engine pins them
for the grouped expert compute), so a miss never evicts an expert the same step needs.
hit rate = hits / requests over all layers. These semantics reproduce the trace README's table.

Must not print or time anything: replay returns counts and `strata.bench.cache` reports them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from strata.errors import StrataError, StrataFormatError
from strata.memory.budget import REPLAY_PREFETCH_MARGIN
from strata.memory.policy import ExpertPolicy, PolicyConfig
from strata.memory.predict import Cooccurrence, CooccurrencePredictor, Lookahead, Predictor


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
    """How the replay drives the policy: prefetch depth (0: hints and prefetch off), how many
    predicted experts per predicted layer the co-occurrence predictor offers (0: top-k), and the
    predictor's filter (`Cooccurrence`: min_prob, min_tokens; decoding's are in `budget.py`).
    `lookahead` adds router look-ahead announcements, here the trace's own next routing (its
    ceiling). The policy's margin defaults to `budget.REPLAY_PREFETCH_MARGIN` (why: there)."""

    prefetch_depth: int = 1
    prefetch_top: int = 0
    predictor_half_life: float | None = None
    policy: PolicyConfig = PolicyConfig(prefetch_margin=REPLAY_PREFETCH_MARGIN)
    min_prob: float = 0.0
    min_tokens: int = 0
    lookahead: bool = False
    cooccurrence: bool = True


def replay_policy(indices: np.ndarray, slots: int, config: ReplayConfig = ReplayConfig(),
                  n_experts: int | None = None,
                  on_step: Callable[[int, int, ExpertPolicy], None] | None = None) -> ReplayResult:
    """Replay through `ExpertPolicy` and the predictors decoding uses (`strata.memory.predict`):
    hints and prefetches for the next `prefetch_depth` layers of the same token. Predictions use
    only past tokens and the current token's earlier layers (look-ahead aside, which announces
    the next layers' routing as the model's routers would). `on_step(token, layer, policy)` runs
    after every step."""
    n_layers, n_tokens, k = indices.shape
    n_experts = n_experts or n_experts_of(indices)
    policy = ExpertPolicy(n_layers, n_experts, slots, top_k=k, config=config.policy)
    predictors: list[Predictor] = []
    token = [0]
    if config.prefetch_depth > 0 and config.lookahead:
        predictors.append(Lookahead(n_layers, config.prefetch_depth, lambda layer: indices[layer, token[0]][None]))
    if config.prefetch_depth > 0 and config.cooccurrence:
        table = CooccurrencePredictor(n_layers, n_experts, k, half_life_tokens=config.predictor_half_life)
        predictors.append(Cooccurrence(table, config.prefetch_depth, config.prefetch_top, config.min_prob,
                                       config.min_tokens))
    run = _PolicyRun(policy, predictors, np.zeros(indices.shape, dtype=bool))
    for t in range(n_tokens):
        token[0] = t
        for layer in range(n_layers):
            run.step(t, layer, indices[layer, t])
            if on_step is not None:
                on_step(t, layer, policy)
    return ReplayResult(hits=run.hits, demand_loads=run.demand_loads, prefetch_loads=run.prefetch_loads,
                        prefetch_used=run.prefetch_used)


class _PolicyRun:
    """The engine's side of the policy during replay, in the order decoding makes the same calls
    (look-ahead announcements, then `TieredExpertMemory.observe`: record, the predictors' observe
    and predictions; then acquire, hits first, and release); loads are instantaneous."""

    def __init__(self, policy: ExpertPolicy, predictors: list[Predictor], hits: np.ndarray) -> None:
        self.policy, self.predictors, self.hits = policy, predictors, hits
        self.prefetched = np.zeros(policy.page_table.shape, dtype=bool)  # [L, E] loaded, not yet used
        self.demand_loads = self.prefetch_loads = self.prefetch_used = 0

    def step(self, t: int, layer: int, expert_ids: np.ndarray) -> None:
        routed = expert_ids[None]  # [T=1, K]
        for predictor in self.predictors:  # the model's look-ahead runs before the router
            if isinstance(predictor, Lookahead):
                for before in ((-1, layer) if layer == 0 else (layer,)):  # -1: from the embeddings
                    self._apply(predictor.predict(before, routed))
        self.policy.record(layer, routed)
        for predictor in self.predictors:
            predictor.observe(layer, routed)
        for predictor in self.predictors:
            if not isinstance(predictor, Lookahead):
                self._apply(predictor.predict(layer, routed))
        self.hits[layer, t] = self._acquire(layer, expert_ids)
        for e in expert_ids:
            self.policy.unpin(layer, e)

    def _acquire(self, layer: int, expert_ids: np.ndarray) -> np.ndarray:
        policy = self.policy
        hit = np.zeros(len(expert_ids), dtype=bool)  # [K]
        for i in policy.hits_first(layer, expert_ids):
            e = expert_ids[i]
            hit[i] = policy.lookup(layer, e) is not None
            if not hit[i]:
                self._load(layer, e, policy.admit(layer, e))
                self.demand_loads += 1
            policy.pin(layer, e)
        self.prefetch_used += int(self.prefetched[layer, expert_ids].sum())
        self.prefetched[layer, expert_ids] = False
        return hit

    def _apply(self, predictions: list) -> None:
        for prediction in predictions:
            layer = prediction.layer
            for e, _, admitted in self.policy.announce(layer, prediction.expert_ids, prediction.probs):
                if admitted is not None:
                    self._load(layer, e, admitted)
                    self.prefetched[layer, e] = True
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
