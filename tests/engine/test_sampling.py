"""Sampling rules on hand-made logits: greedy, filters, penalty, seeds."""
from __future__ import annotations

import pytest
import torch

from strata.engine.sampling import Sampler, SamplingParams, apply_repetition_penalty, filter_logits

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])  # softmax: .56 .21 .13 .08 .03 .004


def _kept(logits: torch.Tensor) -> list[int]:
    return [i for i, v in enumerate(logits.tolist()) if v != float("-inf")]


def test_greedy_takes_the_argmax():
    assert Sampler(SamplingParams(temperature=0))(LOGITS, []) == 0


def test_top_k_keeps_k_tokens():
    assert _kept(filter_logits(LOGITS, SamplingParams(temperature=1.0, top_k=2))) == [0, 1]


def test_top_p_keeps_the_smallest_set_reaching_p():
    assert _kept(filter_logits(LOGITS, SamplingParams(temperature=1.0, top_p=0.5))) == [0]
    assert _kept(filter_logits(LOGITS, SamplingParams(temperature=1.0, top_p=0.7))) == [0, 1]
    assert _kept(filter_logits(LOGITS, SamplingParams(temperature=1.0, top_p=0.8))) == [0, 1, 2]


def test_min_p_drops_tokens_below_a_fraction_of_the_top():
    # p(0) = .56: min_p = .2 keeps tokens with p >= .112: ids 0, 1, 2
    assert _kept(filter_logits(LOGITS, SamplingParams(temperature=1.0, min_p=0.2))) == [0, 1, 2]


def test_temperature_sharpens_and_flattens():
    cold = filter_logits(LOGITS, SamplingParams(temperature=0.5)).softmax(-1)
    hot = filter_logits(LOGITS, SamplingParams(temperature=2.0)).softmax(-1)
    assert cold[0] > LOGITS.softmax(-1)[0] > hot[0]


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    out = apply_repetition_penalty(LOGITS, [0, 4, 4], 2.0)
    assert out.tolist() == [1.0, 1.0, 0.5, 0.0, -2.0, -3.0]
    assert Sampler(SamplingParams(temperature=0, repetition_penalty=3.0))(LOGITS, [0]) == 1


def test_seeded_draws_repeat_and_follow_the_distribution():
    params = SamplingParams(temperature=1.0, seed=7)
    a, b = Sampler(params), Sampler(params)
    draws = [a(LOGITS, []) for _ in range(2000)]
    assert draws == [b(LOGITS, []) for _ in range(2000)]
    freq = torch.bincount(torch.tensor(draws), minlength=6).float() / len(draws)
    assert torch.allclose(freq, LOGITS.softmax(-1), atol=0.04)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=2.0),
                                 dict(top_k=-1), dict(repetition_penalty=0)])
def test_bad_parameters_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_are_an_error_not_a_crash(temperature, bad):
    from strata.errors import StrataError

    logits = LOGITS.clone()
    logits[2] = bad
    sampler = Sampler(SamplingParams(temperature=temperature, seed=1))
    if temperature == 0.0 and bad == float("inf"):
        assert sampler(logits, []) == 2  # greedy: an infinite logit is still the largest
        return
    with pytest.raises(StrataError, match="logits"):
        sampler(logits, [])


@pytest.mark.parametrize("name, bad", [("temperature", float("nan")), ("top_p", float("nan")), ("seed", 2**70),
                                       ("seed", -1), ("top_k", 1.5), ("min_p", float("inf"))])
def test_bad_parameters_name_the_argument(name, bad):
    from strata.errors import StrataArgumentError

    with pytest.raises(StrataArgumentError, match=f"^{name}: expected .* found"):
        SamplingParams(**{name: bad})
