"""Predictors that read hidden states, scored per depth on a recorded run (`strata bench predict`).

A text of random token ids is read in one prefill of a model file (a causal model computes each
token's hidden states as decoding would), and every look-ahead source's hidden state is kept: the
embeddings (-1) and each block's state after its attention (what its FFN norm and router read).
Every router then scores each source's state (`routes`). The replay walks the tokens in order, as
decoding would, one token per step: at each source the look-ahead's top-k for the next `depth`
expert layers, the same with the learned correction (`predict.correction`), co-occurrence, and
the product of the corrected look-ahead's and co-occurrence's probabilities; when a layer routes,
the predictions pending for it are scored (`PredictionScore`). Online: every fit uses the past only.
Must not print: it returns data.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from strata.errors import StrataError
from strata.memory.predict import Cooccurrence, CooccurrencePredictor, Prediction, PredictionScore
from strata.memory.predict.correction import LookaheadCorrection

LOOK_AHEAD, CORRECTED, COOCCURRENCE, BLEND = "look-ahead", "look-ahead, corrected", "co-occurrence", "corrected x co-occurrence"


@dataclass
class Routes:
    """Router logits of a recorded text: `logits[(source, target)]` [T, E] is expert layer
    target's router on source's hidden state (source -1: the embeddings; target == source: the
    logits it routes on), `routed[layer]` [T, K] the experts it chose. Expert layer numbers."""

    logits: dict[tuple[int, int], np.ndarray]
    routed: dict[int, np.ndarray]
    n_layers: int
    n_experts: int
    top_k: int


def record_routes(model_path: str | os.PathLike, tokens: int, depth: int = 3, seed: int = 0,
                  threads: int = 2) -> Routes:
    """Read `tokens` random token ids from `model_path` in one prefill and score every source's
    hidden state with its own router and the next `depth` expert layers' ones."""
    import strata
    from strata.models.moe import MoE

    states: dict[int, torch.Tensor] = {}
    with strata.load(model_path, threads=threads, n_ctx=tokens + 16, memory="direct", compute="float",
                     prefix_cache=False) as m:
        blocks = m.transformer.blocks
        moe = [i for i, b in enumerate(blocks) if isinstance(b.ffn, MoE)]
        handles = [blocks[0].attention_norm.register_forward_pre_hook(lambda mod, a: states.__setitem__(-1, a[0]))]
        for i in moe:
            handles.append(blocks[i].ffn_norm.register_forward_pre_hook(
                lambda mod, a, i=i: states.__setitem__(i, a[0])))
        try:
            text = np.random.default_rng(seed).integers(0, m.transformer.vocab_size, tokens).tolist()
            m.generate(text, max_tokens=1, temperature=0, stop_token_ids=())
        finally:
            for h in handles:
                h.remove()
        return _score_states(blocks, moe, states, tokens, depth)


@torch.inference_mode()
def _score_states(blocks, moe: list[int], states: dict[int, torch.Tensor], tokens: int, depth: int) -> Routes:
    logits, routed = {}, {}
    for si, source in enumerate([-1] + moe):  # expert layer si - 1 reads model layer `source`'s state
        h = states[source][:tokens]  # [T, D] the text (not the one token sampled after it)
        for li in range(max(si - 1, 0), min(si + depth, len(moe))):
            block = blocks[moe[li]]
            x = block.ffn_norm(h)
            z = torch.nn.functional.linear(x, block.ffn.router.weight).float()  # [T, E]
            if block.ffn.router.bias is not None:
                z = z + block.ffn.router.bias
            logits[(si - 1, li)] = z.numpy().astype(np.float64)
            if li == si - 1:
                routed[li] = block.ffn.router(x)[1].numpy()
    router = blocks[moe[0]].ffn.router
    return Routes(logits, routed, len(moe), router.weight.shape[0], router.k)


def _top(layer: int, z: np.ndarray, k: int) -> Prediction:
    order = np.argsort(-z, kind="stable")[:k]
    p = np.exp(z - z.max())
    p /= p.sum()
    return Prediction(layer, order.astype(np.int64), p[order])


def replay(routes: Routes, depth: int = 3, blend_weight: float = 1.0, **correction) -> dict[str, list[dict]]:
    """Scores per predictor and depth (`PredictionScore.to_dict()`), token by token."""
    L, E, K = routes.n_layers, routes.n_experts, routes.top_k
    if depth < 1 or L < 2:
        raise StrataError(f"predictor scores: need depth >= 1 and 2 expert layers or more, found {depth}, {L}")
    fix = LookaheadCorrection(E, K, **correction)
    co = Cooccurrence(CooccurrencePredictor(L, E, K), depth, top=E)
    score = PredictionScore()
    n_tokens = len(routes.routed[0])
    for t in range(n_tokens):
        for source in range(-1, L):
            if source >= 0:
                routed = routes.routed[source][t][None]  # [1, K]
                score.routed(source, routed)
                co.observe(source, routed)
            targets = range(source + 1, min(source + depth, L - 1) + 1)
            own = routes.logits[(source, source)][t][None] if source >= 0 else None
            base = {li: routes.logits[(source, li)][t][None] for li in targets}
            corrected = fix.step(source, own, base)
            cooc = {p.layer: p for p in co.predict(source, routed)} if source >= 0 else {}
            for li in targets:
                score.expect(LOOK_AHEAD, source, _top(li, base[li][0], K))
                score.expect(CORRECTED, source, _top(li, corrected[li][0], K))
                if li in cooc:
                    score.expect(COOCCURRENCE, source, Prediction(li, cooc[li].expert_ids[:K], cooc[li].probs[:K]))
                    score.expect(BLEND, source, _top(li, _blend(corrected[li][0], cooc[li], blend_weight), K))
    return score.to_dict()


def _blend(z: np.ndarray, cooc: Prediction, weight: float) -> np.ndarray:
    """Product of experts: the look-ahead's log-softmax plus `weight` x co-occurrence's log-odds."""
    p = np.empty(len(z))
    p[cooc.expert_ids] = np.clip(cooc.probs, 1e-6, 1 - 1e-6)
    return z - np.log(np.exp(z - z.max()).sum()) + weight * np.log(p / (1 - p))


__all__ = ["BLEND", "CORRECTED", "COOCCURRENCE", "LOOK_AHEAD", "Routes", "record_routes", "replay"]
