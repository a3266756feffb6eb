"""Router look-ahead announcements as predictions.

The model (`strata.models.moe.Lookahead`) applies the next MoE layers' own FFN norm and router to
the current hidden state and announces their top-k experts through the memory's `prefetcher`
(`Prefetcher.prefetch`); the tiered memory turns each announcement into a `Prediction` here. An
announcement carries no probability of its own, so every announced expert counts as certain
(probability 1): its precision (benchmarks/tiered_prefetch.py; benchmarks/RESULTS.md, "Tiered
memory on the CPU") is close enough to 1 that the policy's prefetch margin, not a made-up
probability, decides what it may displace.
The trace replay has no hidden states; `Lookahead.predict` there announces the trace's own next
routing (the look-ahead's ceiling, precision 1). The maths stays in `strata.models`; this file only
says what an announcement means to the memory.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .base import LOOK_AHEAD, Prediction, Predictor


def announcement(layer: int, expert_ids: Sequence[int] | np.ndarray,
                 probs: Sequence[float] | np.ndarray | None = None) -> Prediction:
    """The experts announced for expert layer `layer` (any shape; repeats merged, first one kept),
    with probabilities `probs` (default 1 each), most likely first."""
    ids = np.asarray(expert_ids, dtype=np.int64).ravel()  # [n]
    p = np.ones(ids.shape) if probs is None else np.asarray(probs, dtype=np.float64).ravel()  # [n]
    _, first = np.unique(ids, return_index=True)
    first.sort()
    ids, p = ids[first], p[first]
    order = np.argsort(-p, kind="stable")
    return Prediction(layer, ids[order], p[order])


class Lookahead(Predictor):
    """The replay's stand-in for router look-ahead: given the routing the next `depth` layers will
    make (`routing(layer)` [T, K], known to the replay), announces it as certain."""

    name = LOOK_AHEAD

    def __init__(self, n_layers: int, depth: int, routing: Callable[[int], np.ndarray]):
        self.n_layers, self.depth, self.routing = n_layers, depth, routing

    def predict(self, layer: int, expert_ids: np.ndarray) -> list[Prediction]:
        last = min(layer + self.depth, self.n_layers - 1)
        return [announcement(nxt, self.routing(nxt)) for nxt in range(layer + 1, last + 1)]


__all__ = ["Lookahead", "announcement"]
