"""Precision and recall of each predictor at each depth, against the routing that followed.

A prediction made from expert layer `source` for expert layer `layer` has depth
`layer - source` (1: the next layer). Sources: a predictor fed after layer L routed (co-occurrence)
has source L; the model's look-ahead, run in block L before its router, has source L too (its
hidden state is the one layer L routes from), and -1 from the embeddings. When layer `layer`
routes, every prediction pending for it is scored and dropped:

    predicted += |P|,  actual += |A|,  correct += |P & A|
    precision = correct / predicted,   recall = correct / actual

with P the distinct predicted experts and A the distinct routed ones of that step. A prediction
for a layer that never routes in the step (the step ended first) is dropped unscored by the next
`expect` of the same (predictor, depth, layer). Counting only: no tensors, no threads.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import Prediction

#: Predictions a (predictor, depth) needs scored before its measured precision stands in for its
#: probability (`calibrated`): the standard error of a proportion over 256 is at most 0.031.
CALIBRATION_MIN_PREDICTED = 256


@dataclass
class DepthCounts:
    predicted: int = 0
    actual: int = 0
    correct: int = 0

    @property
    def precision(self) -> float | None:
        return self.correct / self.predicted if self.predicted else None

    @property
    def recall(self) -> float | None:
        return self.correct / self.actual if self.actual else None

    def to_dict(self) -> dict:
        return {"predicted": self.predicted, "actual": self.actual, "correct": self.correct,
                "precision": self.precision, "recall": self.recall}


class PredictionScore:
    """Per predictor name and depth: `DepthCounts` of the predictions scored so far."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[int, DepthCounts]] = {}
        self._pending: dict[int, dict[tuple[str, int], np.ndarray]] = {}  # layer -> (name, depth) -> ids

    def expect(self, name: str, source: int, prediction: Prediction) -> None:
        """`name` predicted `prediction` from layer `source`; a second prediction of the same
        predictor and depth for the same layer before it routes adds its experts."""
        depth = prediction.layer - source
        if depth < 1:
            return
        pending = self._pending.setdefault(prediction.layer, {})
        ids = np.asarray(prediction.expert_ids, dtype=np.int64).ravel()
        old = pending.get((name, depth))
        pending[(name, depth)] = ids if old is None else np.union1d(old, ids)

    def routed(self, layer: int, expert_ids: np.ndarray) -> None:
        """Layer `layer` routed its tokens to `expert_ids` [T, K]: score what was pending for it."""
        pending = self._pending.pop(layer, None)
        if not pending:
            return
        actual = np.unique(np.asarray(expert_ids, dtype=np.int64))
        for (name, depth), ids in pending.items():
            ids = np.unique(ids)
            c = self.counts.setdefault(name, {}).setdefault(depth, DepthCounts())
            c.predicted += int(ids.size)
            c.actual += int(actual.size)
            c.correct += int(np.isin(ids, actual, assume_unique=True).sum())

    def precision(self, name: str, depth: int) -> float | None:
        c = self.counts.get(name, {}).get(depth)
        return None if c is None else c.precision

    def calibrated(self, name: str, depth: int, default: float = 1.0,
                   min_predicted: int = CALIBRATION_MIN_PREDICTED) -> float:
        """The probability that an expert `name` predicts at `depth` is used: its measured
        precision once `min_predicted` predictions are scored, else `default`."""
        c = self.counts.get(name, {}).get(depth)
        return default if c is None or c.predicted < min_predicted else c.precision

    def reset(self) -> None:
        self.counts.clear()
        self._pending.clear()

    def to_dict(self) -> dict[str, list[dict]]:
        """{predictor name: [{depth, predicted, actual, correct, precision, recall}, ...] by depth}."""
        return {name: [{"depth": d, **c.to_dict()} for d, c in sorted(by_depth.items())]
                for name, by_depth in sorted(self.counts.items())}


__all__ = ["CALIBRATION_MIN_PREDICTED", "DepthCounts", "PredictionScore"]
