"""The look-ahead correction: its ridge fit against numpy's lstsq on the same window, its
predictions against a direct computation, the step pairing, and that it learns a drift the plain
look-ahead misses."""
from __future__ import annotations

import numpy as np
import pytest

from strata.errors import StrataError
from strata.memory.predict.correction import LookaheadCorrection, RidgeFit, features


def _lstsq(x, y, ridge):
    """Ridge as plain least squares on rows augmented with sqrt(lam) I (lam as RidgeFit scales it)."""
    lam = ridge * np.mean(np.sum(x * x, axis=0))
    xa = np.vstack([x, np.sqrt(lam) * np.eye(x.shape[1])])
    ya = np.vstack([y, np.zeros((x.shape[1], y.shape[1]))])
    return np.linalg.lstsq(xa, ya, rcond=None)[0]


@pytest.mark.parametrize("ridge", [0.0, 0.05])
def test_the_fit_over_a_wrapped_window_equals_lstsq_on_the_rows_it_holds(ridge):
    rng = np.random.default_rng(0)
    fit = RidgeFit(5, 3, capacity=40, ridge=ridge, refit_every=1000)
    xs = rng.normal(size=(97, 5))
    ys = xs @ rng.normal(size=(5, 3)) + 0.3 * rng.normal(size=(97, 3))
    for lo in range(0, 97, 7):  # steps of 7 tokens: the ring wraps mid-step
        fit.add(xs[lo:lo + 7], ys[lo:lo + 7])
    w = fit.fit()
    x, y = xs[-40:], ys[-40:]  # the window: the last 40 pairs
    assert np.allclose(w, _lstsq(x, y, ridge), atol=1e-9)
    hx, hy = fit.window()
    assert np.allclose(np.sort(hx, axis=0), np.sort(x, axis=0))
    assert np.allclose(fit.apply(x[:3]), x[:3] @ w)


def test_a_long_prefill_keeps_its_last_rows_and_refits_when_due():
    rng = np.random.default_rng(1)
    fit = RidgeFit(4, 2, capacity=16, ridge=0.01, refit_every=10)
    x, y = rng.normal(size=(50, 4)), rng.normal(size=(50, 2))
    fit.add(x[:5], y[:5])
    assert not fit.fitted
    fit.add(x[5:], y[5:])  # more than the window at once
    assert fit.held == 16 and fit.fitted
    assert np.allclose(fit.weight, _lstsq(x[-16:], y[-16:], 0.01), atol=1e-9)


def test_features_hold_the_base_the_own_logits_their_top_k_and_a_one():
    base, own = np.arange(8.0).reshape(2, 4), np.array([[0.0, 3, 1, 2], [5, 4, 0, 1]])
    x = features(base, own, 2)
    assert x.shape == (2, 13)
    assert np.array_equal(x[:, :4], base) and np.array_equal(x[:, 4:8], own)
    assert np.array_equal(x[:, 8:12], [[0, 1, 0, 1], [1, 1, 0, 0]]) and np.all(x[:, 12] == 1)
    assert np.all(features(base, None, 2)[:, 4:12] == 0)


def _steps(rng, n_tokens, drift):
    """Two expert layers: layer 1's true logits are its look-ahead's plus a fixed drift of layer 0's."""
    E = drift.shape[0]
    for _ in range(n_tokens):
        own0 = rng.normal(size=(1, E))
        base1 = 0.5 * rng.normal(size=(1, E))
        yield own0, base1, base1 + own0 @ drift


def test_corrected_predictions_are_the_base_plus_the_fitted_map_and_learn_the_drift():
    rng, E, K = np.random.default_rng(2), 6, 2
    drift = 2.0 * rng.normal(size=(E, E))
    fix = LookaheadCorrection(E, K, capacity=256, ridge=1e-3, refit_every=16)
    right = {"base": 0, "corrected": 0}
    for t, (own0, base1, true1) in enumerate(_steps(rng, 400, drift)):
        out = fix.step(0, own0, {1: base1})[1]
        fit = fix.fits.get((0, 1))
        expected = base1 + features(base1, own0, K) @ fit.weight if fit is not None and fit.fitted else base1
        assert np.array_equal(out, expected)  # the prediction is base + x W, computed directly
        if t >= 200:
            truth = set(np.argsort(-true1[0])[:K])
            right["base"] += len(truth & set(np.argsort(-base1[0])[:K]))
            right["corrected"] += len(truth & set(np.argsort(-out[0])[:K]))
        fix.step(1, true1, {})  # layer 1 routes: the pair (layer 0's features, its residual) is learnt
    x, r = fix.fits[(0, 1)].window()
    assert np.allclose(fix.fits[(0, 1)].fit(), _lstsq(x, r, 1e-3), atol=1e-8)
    assert right["corrected"] > 0.9 * 200 * K > right["base"]


def test_a_new_step_drops_what_the_last_one_left_unpaired_and_wrong_widths_are_refused():
    fix = LookaheadCorrection(4, 1)
    fix.step(0, np.zeros((1, 4)), {2: np.zeros((1, 4))})
    fix.step(0, np.zeros((1, 4)), {})  # a new step before layer 2 routed
    fix.step(2, np.ones((1, 4)), {})
    assert fix.fits == {}
    with pytest.raises(StrataError, match="logits of layer 3 have 5 experts, expected 4"):
        fix.step(1, None, {3: np.zeros((1, 5))})


# ---- in a decode: the model's look-ahead through the correction -----------------------------------

import torch  # noqa: E402

from strata.memory.predict import LOOK_AHEAD  # noqa: E402

from .tiered_fixture import GREEDY, load_tiered, moe_file, prompt, tiered  # noqa: E402


@pytest.fixture(scope="module")
def path():
    return moe_file()


def test_outputs_are_byte_identical_with_and_without_the_corrected_predictor(path):
    runs = []
    for depth, predictor in ((0, "look-ahead"), (2, "look-ahead"), (2, "corrected")):
        with load_tiered(path, depth=depth, predictor=predictor, prefetch_read_cost=0.0) as m:
            runs.append((m.logits(prompt(20)), m.generate(prompt(20), max_tokens=12, **GREEDY).token_ids))
            if predictor == "corrected":
                fits = m.memory.lookahead_correction.fits
                assert fits and all(f.held > 0 for f in fits.values())  # it learnt from the decode
                assert m.memory_stats().prediction_score.to_dict()[LOOK_AHEAD][0]["predicted"] > 0
    for logits, tokens in runs[1:]:
        assert torch.equal(logits, runs[0][0]) and tokens == runs[0][1]
    with pytest.raises(StrataError, match="predictor must be one of look-ahead, corrected"):
        tiered(path, "dequantized", 1, predictor="oracle")


def test_corrected_look_ahead_predictions_equal_a_direct_torch_computation(path):
    with load_tiered(path, depth=2, predictor="corrected") as m:
        m.generate([t % 390 for t in prompt(40)], max_tokens=4, **GREEDY)  # the fits learn
        block, fix = m.transformer.blocks[1], m.memory.lookahead_correction
        fix.step(10 ** 6, None, {})  # a new step: the one below is alone in it
        for fit in fix.fits.values():
            fit.fit()  # 44 pairs: not yet refitted on its own (every 64)
        h = torch.randn(3, m.transformer.embedding.shape[1])
        norm1, router1 = block.ffn_norm, block.ffn.router

        def logits(norm, router, x):
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight  # RMS norm
            return (x @ router.weight.T).double().numpy()  # [T, E]

        fits = {t: fix.fits.get((1, t)) for t, _, _ in block.lookahead.targets}
        weights = {t: None if f is None else f.weight.copy() for t, f in fits.items()}
        got = block.lookahead.predict(h)
        own = logits(norm1, router1, h)
        for (layer, ids), (_, norm, router) in zip(got, block.lookahead.targets):
            base = logits(norm, router, h)
            z = base if weights[layer] is None else base + features(base, own, router.k) @ weights[layer]
            expected = torch.topk(torch.from_numpy(z), router.k, dim=-1).indices
            assert torch.equal(ids.sort(-1).values, expected.sort(-1).values)
        assert any(w is not None and w.any() for w in weights.values())  # a fitted map was applied
