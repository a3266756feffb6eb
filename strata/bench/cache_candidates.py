"""`strata bench cache --candidates`: eviction, placement and prefetch candidates measured against
Belady on a routing trace, each as a share of Belady's hit rate and a multiple of Belady's loads.

Same replay rules as `strata.bench.cache` (per-layer slots, cold start counted, the current step's
experts pinned, loads instantaneous). Each candidate is a keep value per expert (the victim is the
unpinned resident expert of least value), computed from what an online cache knows at that step:
  lfu        uses so far (the fixed hot set learnt online);
  lrfu       decayed uses (the engine policy's own score, half-life 128 steps);
  reuse      expected reuse distance: last use plus the expert's mean inter-arrival time (an
             exponential average), "least stale" first evicted;
  predicted  expected steps to the next use, 1 + (1 - q) / r, with q the co-occurrence predictor's
             probability that the token's next layer uses the expert (from the layer just routed)
             and r the decayed use rate: Belady's rule with the future replaced by its expectation;
  budgets    lrfu with per-layer slot budgets solved from routing counts (`allocate_budgets`);
  +prefetch  predicted, and before each step the predicted experts of q >= 0.6 are loaded, each
             only over a victim whose own q is lower (prefetch never evicts a likelier expert);
and two bounds that are not online: the best fixed hot set (knows the trace's counts) and Belady
that sees only the next W steps (`window-W`), which says how far ahead the optimum must look.

Must not print: it returns data and `strata.commands.bench` prints it.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from strata.bench.cache import _next_use, replay_belady, replay_fixed
from strata.errors import StrataError
from strata.memory.predict import CooccurrencePredictor
from strata.memory.trace import load_trace, n_experts_of

HALF_LIFE = 128.0  # the engine policy's (PolicyConfig.half_life_steps)
GAP_WEIGHT = 0.3  # weight of the newest inter-arrival time in its exponential average
PREFETCH_MIN_PROB = 0.6  # best of 0.3 / 0.6 on the three traces (loads within 1.23-2.8x Belady's)
WINDOWS = (1, 16, 256)


def allocate_budgets(counts: np.ndarray, total: int, floor: int, cap: int | None = None) -> np.ndarray:
    """Per-layer slot budgets (int64 [L]) summing to `total`, each in [floor, cap], that maximise
    the hit rate of each layer's hottest experts under `counts` [L, E]: greedy on the marginal
    gain, which is exact since a layer's sorted shares decrease (a concave hit curve). Layers
    with skewed routing get fewer slots than layers with flat routing."""
    counts = np.asarray(counts, dtype=np.float64)
    n_layers, n_experts = counts.shape
    cap = n_experts if cap is None else cap
    if not 1 <= floor <= cap <= n_experts or not n_layers * floor <= total <= n_layers * cap:
        raise StrataError(f"slot budgets: {total} slots over {n_layers} layers cannot give each between "
                          f"{floor} and {cap} of its {n_experts} experts")
    shares = -np.sort(-counts, axis=1) / np.maximum(counts.sum(axis=1, keepdims=True), 1e-12)  # [L, E]
    budgets = np.full(n_layers, floor, dtype=np.int64)
    rows = np.arange(n_layers)
    for _ in range(total - int(budgets.sum())):
        gain = np.where(budgets < cap, shares[rows, np.minimum(budgets, n_experts - 1)], -np.inf)  # [L]
        budgets[int(np.argmax(gain))] += 1
    return budgets


def cooccurrence_probs(indices: np.ndarray) -> np.ndarray:
    """q [L, T, E]: for layers 1.., the online co-occurrence probability that token t uses each
    expert, from the table fitted on earlier tokens and token t's previous layer; NaN at layer 0."""
    n_layers, n_tokens, k = indices.shape
    table = CooccurrencePredictor(n_layers, n_experts_of(indices), k)
    q = np.full((n_layers, n_tokens, table.n_experts), np.nan)
    for t in range(n_tokens):
        for layer in range(n_layers):
            table.observe(layer, indices[layer, t])
            if layer + 1 < n_layers:
                q[layer + 1, t] = table.probabilities(layer, indices[layer, t])
    return q


class _Layer:
    """What an online cache knows about one layer's experts after steps 0..t-1."""

    def __init__(self, seq: np.ndarray, n_experts: int) -> None:
        self.k, self.n_experts = seq.shape[1], n_experts
        self.uses = np.zeros(n_experts)  # [E]
        self.decayed = np.zeros(n_experts)  # [E]
        self.steps = 0.0
        self.last = np.full(n_experts, -1.0)  # [E]
        self.gap = np.zeros(n_experts)  # [E] mean inter-arrival, 0 until seen twice
        self.next_use = _next_use(seq, n_experts)  # [T, K] (window bounds only)
        self.when = np.full(n_experts, len(seq), dtype=np.int64)  # [E] next use of each expert

    def rate(self) -> np.ndarray:  # [E] decayed use rate, one step of prior at top-k / E
        return (self.decayed + self.k / self.n_experts) / (self.steps + 1.0)

    def observe(self, t: int, step: np.ndarray) -> None:
        self.uses[step] += 1
        self.decayed *= 0.5 ** (1.0 / HALF_LIFE)
        self.decayed[step] += 1
        self.steps = self.steps * 0.5 ** (1.0 / HALF_LIFE) + 1
        seen, gap = self.last[step] >= 0, t - self.last[step]
        self.gap[step] = np.where(seen & (self.gap[step] > 0), (1 - GAP_WEIGHT) * self.gap[step] + GAP_WEIGHT * gap,
                                  np.where(seen, gap, 0.0))
        self.last[step] = t
        self.when[step] = self.next_use[t]


def _keep(kind: str) -> Callable[[_Layer, int, np.ndarray], np.ndarray]:
    """The keep value [E] of a candidate at step t (q: this step's predicted probabilities or NaN)."""
    def predicted(s: _Layer, t: int, q: np.ndarray) -> np.ndarray:
        r = s.rate()
        p = r if np.isnan(q[0]) else q
        return -(1.0 + (1.0 - p) / r)

    def reuse(s: _Layer, t: int, q: np.ndarray) -> np.ndarray:
        gap = np.where(s.gap > 0, s.gap, s.n_experts / s.k)
        return -np.where(s.last >= 0, s.last + gap - t, s.n_experts / s.k)

    if kind.startswith("window-"):
        w = int(kind.split("-")[1])
        return lambda s, t, q: np.where(s.when - t <= w, -s.when.astype(np.float64), -1e18 + s.uses)
    table = {"lfu": lambda s, t, q: s.uses, "lrfu": lambda s, t, q: s.rate(), "budgets": lambda s, t, q: s.rate(),
             "reuse": reuse, "predicted": predicted, "predicted+prefetch": predicted}
    if kind not in table:
        raise StrataError(f"cache candidate {kind!r}: expected one of {', '.join(CANDIDATES)} or window-W")
    return table[kind]


CANDIDATES = ("lfu", "lrfu", "reuse", "predicted", "budgets", "predicted+prefetch")


def replay_candidate(indices: np.ndarray, slots, kind: str, q: np.ndarray | None = None,
                     on_step: Callable[[int, int, np.ndarray], None] | None = None) -> dict:
    """Replay `indices` [L, T, K] under candidate `kind` at `slots` per layer (an int or [L]).
    `q` [L, T, E] from `cooccurrence_probs` (computed here when a candidate needs it).
    `on_step(layer, t, resident bool [E])` runs after every step. Returns hit rate, loads per
    request and prefetch loads."""
    n_layers, n_tokens, k = indices.shape
    n_experts = n_experts_of(indices)
    budgets = np.broadcast_to(np.asarray(slots, dtype=np.int64), (n_layers,))
    if q is None:
        q = cooccurrence_probs(indices) if kind.startswith("predicted") else np.full((n_layers, n_tokens, 1), np.nan)
    keep, prefetch = _keep(kind), kind.endswith("+prefetch")
    hits = loads = prefetches = 0
    for layer in range(n_layers):
        state, slots = _Layer(indices[layer], n_experts), int(budgets[layer])
        resident = np.zeros(n_experts, dtype=bool)  # [E]
        for t in range(n_tokens):
            step, qt = indices[layer, t], q[layer, t]
            if prefetch and not np.isnan(qt[0]):
                prefetches += _prefetch(resident, slots, qt)
            hits += int(resident[step].sum())
            value = keep(state, t, qt)
            for e in step:
                if not resident[e]:
                    if resident.sum() >= slots:
                        evictable = np.flatnonzero(resident & ~np.isin(np.arange(n_experts), step))
                        resident[evictable[np.argmin(value[evictable])]] = False
                    resident[e] = True
                    loads += 1
            state.observe(t, step)
            if on_step is not None:
                on_step(layer, t, resident)
    return {"hit_rate": hits / indices.size, "loads_per_request": (loads + prefetches) / indices.size,
            "prefetch_loads": prefetches}


def _prefetch(resident: np.ndarray, slots: int, q: np.ndarray) -> int:
    """Load the experts of q >= PREFETCH_MIN_PROB, likeliest first, each into a free slot or over
    the resident expert of least q when that q is lower than its own. Returns the loads."""
    loads = 0
    for e in np.argsort(-q, kind="stable"):
        if q[e] < PREFETCH_MIN_PROB:
            break
        if resident[e]:
            continue
        if resident.sum() >= slots:
            held = np.flatnonzero(resident)
            victim = held[np.argmin(q[held])]
            if q[victim] >= q[e]:
                break
            resident[victim] = False
        resident[e] = True
        loads += 1
    return loads


def bench_candidates(path: str | Path, slots: list[int]) -> dict:
    """Every candidate and bound at each slot count: hit rate / Belady's, loads / Belady's."""
    indices = load_trace(path)
    n_layers, n_tokens, k = indices.shape
    n_experts = n_experts_of(indices)
    q = cooccurrence_probs(indices) if n_layers > 1 else np.full((n_layers, n_tokens, n_experts), np.nan)
    counts = np.stack([np.bincount(indices[layer].ravel(), minlength=n_experts) for layer in range(n_layers)])
    out = {"trace": str(path), "n_experts": n_experts, "slots": {}}
    for n in slots:
        belady = replay_belady(indices, n)
        ref_hit, ref_loads = belady.hit_rate, belady.demand_loads / indices.size
        fixed = replay_fixed(indices, n).hit_rate
        rows = {"fixed hot set*": (fixed, 1.0 - fixed)}
        for kind in CANDIDATES + tuple(f"window-{w}" for w in WINDOWS):
            budgets = allocate_budgets(counts, n * n_layers, k) if kind == "budgets" else n
            r = replay_candidate(indices, budgets, kind, q)
            rows[kind] = (r["hit_rate"], r["loads_per_request"])
        out["slots"][str(n)] = {"belady_hit_rate": ref_hit, "belady_loads": ref_loads,
                                **{name: {"hit_over_belady": h / ref_hit, "loads_over_belady": ld / ref_loads}
                                   for name, (h, ld) in rows.items()}}
    return out
