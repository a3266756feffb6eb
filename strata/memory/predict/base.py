"""The predictor interface: what feeds `Prefetcher.prefetch` and the policies' hints.

A predictor says, after expert layer `li` routed its tokens, which experts the next layers'
steps will ask for, as `Prediction`s (expert-layer index, expert ids most likely first, their
probabilities). The tiered memory (`tiered.py`) and the trace replay (`trace.py`) drive the
same predictor objects the same way: `observe` every layer's routing, then `predict`, then the
policy's `announce` (hint every predicted expert, admit the ones it finds room for). A new
predictor is one file in this package with a `Predictor` subclass. Predictors are plain
numpy: no tensors, no threads, no bytes moved.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Prediction:
    """Experts expected at expert layer `layer`'s next step, most likely first."""

    layer: int  # expert-layer index 0..L-1
    expert_ids: np.ndarray  # [n] int64
    probs: np.ndarray  # [n] float64, non-increasing


#: The name the model's router look-ahead is scored under (`score.PredictionScore`).
LOOK_AHEAD = "look-ahead"


class Predictor(ABC):
    """Predicts the next layers' experts from the routing seen so far; `name` labels its scores."""

    name = "predictor"

    def observe(self, layer: int, expert_ids: np.ndarray) -> None:
        """Expert layer `layer` routed its tokens to `expert_ids` [T, K] (layer after layer within
        a step). The default learns nothing."""

    @abstractmethod
    def predict(self, layer: int, expert_ids: np.ndarray) -> list[Prediction]:
        """After `layer` routed `expert_ids` [T, K]: predictions for the following layers (none,
        one or more, at most one per layer)."""


def merge(layer: int, expert_ids: list[np.ndarray], probs: list[np.ndarray],
          min_prob: float = 0.0) -> Prediction | None:
    """One prediction for `layer` from several (one per token): each expert at its highest
    probability, those below `min_prob` dropped, most likely first; None when nothing is left."""
    ids = np.concatenate(expert_ids).astype(np.int64)  # [n]
    p = np.concatenate(probs).astype(np.float64)  # [n]
    keep = p >= min_prob
    ids, p = ids[keep], p[keep]
    if ids.size == 0:
        return None
    best: dict[int, float] = {}
    for e, pe in zip(ids.tolist(), p.tolist()):  # first occurrence wins ties: the tokens' own order
        if pe > best.get(e, -1.0):
            best[e] = pe
    out_ids = np.fromiter(best, dtype=np.int64, count=len(best))
    out_p = np.fromiter(best.values(), dtype=np.float64, count=len(best))
    order = np.argsort(-out_p, kind="stable")
    return Prediction(layer, out_ids[order], out_p[order])


__all__ = ["LOOK_AHEAD", "Prediction", "Predictor", "merge"]
