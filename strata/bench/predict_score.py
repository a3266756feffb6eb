"""Precision and recall per depth of the predictors that need only routing indices, replayed on
a routing trace (`strata bench cache`). Predictors that read hidden states (the router
look-ahead) are scored during a real decode by the tiered memory itself (`MemoryStats.
prediction_score`, shown by `--stats` and `strata bench MODEL`): the same `PredictionScore`
counts both.

Replay order is decoding's: when layer L of token t routes, first the predictions pending for it
are scored, then the predictor learns that routing, then it predicts layers L+1..L+depth of the
same token. Online: every prediction uses only the past. Must not print: it returns data.
"""
from __future__ import annotations

import numpy as np

from strata.errors import StrataError
from strata.memory.budget import DEFAULT_PREFETCH_READ_COST
from strata.memory.predict import Cooccurrence, CooccurrencePredictor, Prediction, PredictionScore, Predictor
from strata.memory.trace import n_experts_of


def replay_scores(indices: np.ndarray, predictors: list[Predictor],
                  read_cost: float | None = None) -> dict[str, list[dict]]:
    """Each predictor (fed every step of the trace [L, T, K]) scored per depth, as
    `PredictionScore.to_dict()`; with `read_cost`, also the part of its predictions decoding would
    load (p > read_cost, `TieredConfig.prefetch_read_cost`), under "NAME, p > COST"."""
    n_layers, n_tokens, _ = indices.shape
    score = PredictionScore()
    for t in range(n_tokens):
        for layer in range(n_layers):
            routed = indices[layer, t][None]  # [T=1, K]
            score.routed(layer, routed)
            for predictor in predictors:
                predictor.observe(layer, routed)
                for p in predictor.predict(layer, routed):
                    score.expect(predictor.name, layer, p)
                    if read_cost is not None:
                        keep = p.probs > read_cost
                        score.expect(paid_name(predictor.name, read_cost), layer,
                                     Prediction(p.layer, p.expert_ids[keep], p.probs[keep]))
    return score.to_dict()


def paid_name(name: str, read_cost: float) -> str:
    return f"{name}, p > {read_cost:g}"


def trace_scores(indices: np.ndarray, depth: int = 3,
                 read_cost: float = DEFAULT_PREFETCH_READ_COST) -> dict[str, list[dict]]:
    """The co-occurrence predictor on the trace, its top-k and the share of it that pays for its
    read, at depths 1..depth (fewer where the trace has fewer layers)."""
    n_layers, _, k = indices.shape
    if depth < 1 or n_layers < 2:
        raise StrataError(f"predictor scores: need depth >= 1 and a trace of 2 layers or more, "
                          f"found depth {depth} and {n_layers} layers")
    depth = min(depth, n_layers - 1)
    predictor = Cooccurrence(CooccurrencePredictor(n_layers, n_experts_of(indices), k), depth)
    return replay_scores(indices, [predictor], read_cost)


__all__ = ["paid_name", "replay_scores", "trace_scores"]
