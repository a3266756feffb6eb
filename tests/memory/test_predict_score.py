"""Precision and recall per depth: `PredictionScore` against hand-counted cases, the trace replay
against the co-occurrence recall computed on its own, and the look-ahead scored during a decode
against an independent count of what it announced and what the routers chose."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from strata.errors import StrataError
from strata.bench.predict_score import paid_name, replay_scores, trace_scores
from strata.memory.predict import LOOK_AHEAD, Prediction, PredictionScore, Predictor
from strata.memory.trace import predictor_recall

from .tiered_fixture import GREEDY, load_tiered, moe_file, prompt, tiered

torch.set_num_threads(1)


def _p(layer, ids, probs=None):
    ids = np.asarray(ids, dtype=np.int64)
    return Prediction(layer, ids, np.ones(ids.shape) if probs is None else np.asarray(probs, dtype=np.float64))


def test_a_hand_made_case_has_the_precision_and_recall_counted_by_hand():
    score = PredictionScore()
    score.expect("a", 0, _p(1, [1, 2, 3]))  # depth 1
    score.expect("a", 0, _p(2, [4, 5]))  # depth 2
    score.expect("a", -1, _p(0, [9]))  # from the embeddings: depth 1
    score.routed(0, np.array([[9, 0]]))  # 1 of 1 predicted right, 1 of 2 routed found
    score.routed(1, np.array([[1, 2], [7, 8]]))  # {1,2,3} vs {1,2,7,8}: 2 right of 3, 2 found of 4
    score.routed(2, np.array([[5, 6]]))  # {4,5} vs {5,6}: 1 of 2, 1 of 2
    d1, d2 = score.to_dict()["a"]
    assert (d1["depth"], d1["predicted"], d1["actual"], d1["correct"]) == (1, 4, 6, 3)
    assert d1["precision"] == pytest.approx(3 / 4) and d1["recall"] == pytest.approx(3 / 6)
    assert (d2["depth"], d2["precision"], d2["recall"]) == (2, 0.5, 0.5)
    score.routed(1, np.array([[1, 2]]))  # nothing pending any more: nothing counted twice
    assert score.to_dict()["a"][0]["predicted"] == 4
    assert score.calibrated("a", 1, min_predicted=4) == pytest.approx(0.75)
    assert score.calibrated("a", 1, min_predicted=5) == 1.0 and score.calibrated("b", 1) == 1.0


class _Fixed(Predictor):
    """Predicts experts {0, 1} with probabilities 0.9 and 0.2 for every following layer."""

    name = "fixed"

    def predict(self, layer, expert_ids):
        return [_p(nxt, [0, 1], [0.9, 0.2]) for nxt in range(layer + 1, 3)]


def test_replay_scores_count_each_depth_and_what_pays_for_its_read():
    rng = np.random.default_rng(0)
    indices = np.stack([np.stack([rng.permutation(6)[:2] for _ in range(40)]) for _ in range(3)])  # [3, 40, 2]
    scores = replay_scores(indices, [_Fixed()], read_cost=0.5)
    for name, predicted in (("fixed", {0, 1}), (paid_name("fixed", 0.5), {0})):
        for row in scores[name]:
            targets = range(row["depth"], 3)  # layers predicted at this depth
            correct = sum(len(predicted & set(indices[t, i].tolist())) for t in targets for i in range(40))
            n = len(targets) * 40
            assert row["precision"] == pytest.approx(correct / (len(predicted) * n))
            assert row["recall"] == pytest.approx(correct / (2 * n))
    assert [r["depth"] for r in scores["fixed"]] == [1, 2]


def test_co_occurrence_scored_on_a_trace_matches_its_own_recall():
    rng = np.random.default_rng(1)
    base = rng.permutation(16)
    layer0 = np.stack([rng.permutation(16)[:2] for _ in range(60)])  # [T, 2]
    indices = np.stack([layer0, base[layer0], base[base[layer0]]])  # layer l+1 follows layer l
    rows = trace_scores(indices, depth=2)["co-occurrence"]
    recall = predictor_recall(indices, depth=2)
    assert [r["recall"] for r in rows] == pytest.approx(recall)
    assert [r["precision"] for r in rows] == pytest.approx(recall)  # k predicted against k routed
    assert rows[0]["recall"] > 0.5  # the affinity is learnt


@pytest.fixture(scope="module")
def path():
    return moe_file()


def test_decoding_scores_the_look_ahead_per_depth_as_counted_independently(path):
    with load_tiered(path, depth=2, cooccurrence=False, prefetch_read_cost=0.0) as m:
        mem, seen = m.memory, []  # (kind, layer, experts, source)
        prefetch, observe = mem.prefetch, mem.observe

        def spy_prefetch(layer, expert_ids, probs=None, source=None):
            seen.append(("p", layer, set(expert_ids), source))
            prefetch(layer, expert_ids, probs, source)

        def spy_observe(layer, expert_ids):
            seen.append(("o", layer, set(expert_ids.flatten().tolist()), None))
            observe(layer, expert_ids)

        mem.prefetch, mem.observe = spy_prefetch, spy_observe
        m.memory_stats().reset()
        m.generate(prompt(6), max_tokens=8, **GREEDY)
        counts, pending = {}, {}
        for kind, layer, experts, source in seen:  # model layers are expert layers here (all MoE)
            if kind == "p":
                pending.setdefault(layer, {}).setdefault(layer - source, set()).update(experts)
                continue
            for depth, predicted in pending.pop(layer, {}).items():
                c = counts.setdefault(depth, [0, 0, 0])
                c[0], c[1], c[2] = c[0] + len(predicted), c[1] + len(experts), c[2] + len(predicted & experts)
        rows = m.memory_stats().prediction_score.to_dict()[LOOK_AHEAD]
        assert [r["depth"] for r in rows] == [1, 2]
        for r in rows:
            assert [r["predicted"], r["actual"], r["correct"]] == counts[r["depth"]]
        assert rows[0]["precision"] > 0.5


def test_look_ahead_predictions_are_the_next_routers_top_k_on_the_hidden_state(path):
    with load_tiered(path, depth=2) as m:
        block = m.transformer.blocks[0]
        h = torch.randn(5, m.transformer.embedding.shape[1])
        for (layer, ids), (_, norm, router) in zip(block.lookahead.predict(h), block.lookahead.targets):
            x = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight  # RMS norm
            logits = x @ router.weight.T  # [T, E]
            expected = torch.topk(logits, router.k, dim=-1).indices  # softmax keeps the order
            assert torch.equal(ids.sort(-1).values, expected.sort(-1).values)


def test_a_prediction_that_does_not_pay_for_its_read_is_not_prefetched(path):
    with load_tiered(path, depth=1, prefetch_read_cost=0.5) as m:
        mem, stats = m.memory, m.memory_stats()
        stats.reset()
        mem.prefetch(1, [1, 3], [0.3, 0.45])
        assert stats.total("prefetch_issued") == 0 and stats.total("prefetch_unpaid") == 2
        mem.prefetch(1, [5], [0.9])
        assert stats.total("prefetch_issued") + stats.total("prefetch_refused") == 1
    with pytest.raises(StrataError, match="prefetch read cost"):
        tiered(path, "dequantized", 1, prefetch_read_cost=1.5)


def test_outputs_are_byte_identical_with_and_without_prediction(path):
    runs = []
    for depth, cost in ((0, 0.5), (2, 0.0), (2, 0.5)):
        with load_tiered(path, depth=depth, prefetch_read_cost=cost) as m:
            runs.append((m.logits(prompt(20)), m.generate(prompt(20), max_tokens=12, **GREEDY).token_ids))
    for logits, tokens in runs[1:]:
        assert torch.equal(logits, runs[0][0]) and tokens == runs[0][1]
