"""OpenAI's sampling options: additive penalties, logit_bias, logprobs (checked against a torch
computation), n choices, and a seeded request that draws the same alone and beside others."""
from __future__ import annotations

import pytest
import torch

from strata.engine.config import OptionError
from strata.engine.sampling import (MAX_SEED, Sampler, SamplingParams, apply_penalties, filter_logits, sample_batch,
                                    token_logprobs)

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def test_frequency_and_presence_penalties_are_openais_additive_rule_over_generated_tokens():
    p = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    history = [0, 1, 1, 3, 3, 3]  # prompt [0, 1], generated [1, 3, 3, 3]
    out = apply_penalties(LOGITS[None], [p], [history], [2])[0]
    counts = torch.bincount(torch.tensor(history[2:]), minlength=6).float()
    expected = LOGITS - 0.5 * counts - 0.25 * (counts > 0).float()
    assert torch.allclose(out, expected)
    assert out[0] == LOGITS[0]  # a prompt token is not penalised


def test_penalties_and_bias_over_a_batch_equal_each_row_alone():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    params = [SamplingParams(frequency_penalty=1.0), SamplingParams(),
              SamplingParams(presence_penalty=-1.5, repetition_penalty=1.3, logit_bias={"7": 5.0, 9: -100}),
              SamplingParams(logit_bias={3: 2.5})]
    histories = [[1, 2, 2, 5], [4, 4], [7, 7, 9, 10, 10], [3]]
    batch = apply_penalties(logits, params, histories, [1, 1, 2, 1])
    for i in range(4):
        alone = apply_penalties(logits[i:i + 1], params[i:i + 1], histories[i:i + 1], [[1, 1, 2, 1][i]])[0]
        assert torch.equal(batch[i], alone)
    assert torch.equal(batch[1], logits[1])
    assert batch[3, 3] == logits[3, 3] + 2.5
    assert batch[2, 9] < logits[2, 9] - 95  # -100 bias, +1.5 from the negative presence penalty


def test_logit_bias_forces_and_bans():
    assert Sampler(SamplingParams(temperature=0, logit_bias={5: 100}))(LOGITS, []) == 5
    assert Sampler(SamplingParams(temperature=0, logit_bias={"0": -100}))(LOGITS, []) == 1
    hot = Sampler(SamplingParams(temperature=1.0, seed=3, logit_bias={4: 100}))
    assert {hot(LOGITS, []) for _ in range(50)} == {4}


def _reference_logprobs(logits: torch.Tensor, p: SamplingParams, history: list[int], n_prompt: int) -> torch.Tensor:
    """The processed distribution written out with plain torch: penalties, bias, temperature."""
    x = logits.clone()
    for t in set(history):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(history[n_prompt:]):
        x[t] -= p.frequency_penalty * history[n_prompt:].count(t) + p.presence_penalty
    for t, b in p.logit_bias:
        x[t] += b
    return torch.log_softmax(x / (p.temperature or 1.0), dim=-1)


@pytest.mark.parametrize("p", [SamplingParams(temperature=0, top_k=0, logprobs=3),
                               SamplingParams(temperature=0.7, top_k=2, seed=1, logprobs=5),
                               SamplingParams(temperature=1.3, top_k=0, repetition_penalty=1.2, frequency_penalty=0.4,
                                              presence_penalty=0.3, logit_bias={2: 1.5}, seed=2, logprobs=0)])
def test_logprobs_are_the_log_softmax_of_the_processed_logits(p):
    torch.manual_seed(1)
    logits = torch.randn(64) * 3
    history = [5, 9, 9, 2, 2, 2, 40]
    (token, lp), = sample_batch(logits[None], [Sampler(p)], [history], [2])
    ref = _reference_logprobs(logits, p, history, 2)
    assert lp.token_id == token and lp.logprob == pytest.approx(float(ref[token]), abs=1e-5)
    values, ids = ref.topk(p.logprobs)
    assert [t for t, _ in lp.top] == ids.tolist()
    assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=1e-5)
    if p.top_k:  # truncation does not enter the reported distribution: an alternative outside top-k is finite
        assert torch.isinf(filter_logits(logits, p)).sum() == 62 and all(v > -1e9 for _, v in lp.top)


def test_logprobs_only_for_the_rows_that_ask():
    logits = torch.randn(3, 20)
    picks = sample_batch(logits, [Sampler(SamplingParams()), Sampler(SamplingParams(logprobs=2)),
                                  Sampler(SamplingParams())], [[1], [1], [1]], [1, 1, 1])
    assert [lp is None for _, lp in picks] == [True, False, True]
    assert token_logprobs(logits[1:2], [SamplingParams(logprobs=2)], [picks[1][0]])[0] == picks[1][1]


@pytest.mark.parametrize("options, field, words", [
    (dict(frequency_penalty=2.5), "frequency_penalty", "<= 2"), (dict(presence_penalty=-3), "presence_penalty", ">= -2"),
    (dict(logprobs=21), "logprobs", "<= 20"), (dict(logprobs=-1), "logprobs", ">= 0"), (dict(n=0), "n", ">= 1"),
    (dict(n=17), "n", "<= 16"), (dict(logit_bias={"abc": 1}), "logit_bias", "token ids"),
    (dict(logit_bias={5: 101}), "logit_bias", "<= 100"), (dict(logit_bias={5: "x"}), "logit_bias", "number"),
    (dict(logit_bias=[1, 2]), "logit_bias", "map"), (dict(logit_bias="x"), "logit_bias", "map"),
])
def test_bad_options_name_their_field(options, field, words):
    with pytest.raises(OptionError) as info:
        SamplingParams.build(**options)
    assert info.value.option == field and words in str(info.value)


def test_logit_bias_ids_are_checked_against_the_vocabulary(loaded):
    model = loaded("qwen3moe")
    with pytest.raises(OptionError, match=r"logit_bias: token id 999999 is outside the vocabulary"):
        model.generate("hi", logit_bias={999999: 1.0}, max_tokens=2)


def test_choice_seeds():
    p = SamplingParams(seed=MAX_SEED, n=3)
    assert [p.for_choice(i).seed for i in range(3)] == [MAX_SEED, 0, 1]
    assert SamplingParams(n=2).for_choice(1).seed is None


def test_engine_logprobs_equal_the_models_logits(loaded):
    model = loaded("qwen3moe")
    done = model.generate("The cache", max_tokens=6, logprobs=4, stop_token_ids=(), temperature=0)
    ids = model.tokenize("The cache")
    logits = model.logits(ids + done.token_ids)  # [T, V]
    ref = torch.log_softmax(logits[len(ids) - 1:-1], dim=-1)
    assert [lp.token_id for lp in done.logprobs] == done.token_ids
    for lp, row in zip(done.logprobs, ref):
        assert lp.logprob == pytest.approx(float(row.max()), abs=1e-3)  # greedy: the top token
        assert [t for t, _ in lp.top] == row.topk(4).indices.tolist()
    streamed = [c.logprob for c in model.generate("The cache", max_tokens=6, logprobs=4, stop_token_ids=(),
                                                  temperature=0, stream=True) if c.token_id is not None]
    assert [s.token_id for s in streamed] == done.token_ids


def test_seeded_request_alone_and_beside_others(loaded):
    model = loaded("qwen3moe")
    options = dict(temperature=1.0, seed=1234, max_tokens=12, stop_token_ids=(), presence_penalty=0.5,
                   logit_bias={3: 2.0})
    alone = model.generate("once upon", **options).token_ids
    streams = [model.generate(p, stream=True, temperature=1.0, max_tokens=12, stop_token_ids=(), seed=s)
               for p, s in (("hello there", 5), ("a b c", 6))]
    target = model.generate("once upon", stream=True, **options)
    together = []
    for chunks in zip(target, *streams):  # all three decode in the same steps
        together.append(chunks[0].token_id)
    assert together == alone


def test_n_choices(loaded):
    model = loaded("qwen3moe")
    choices = model.generate("once upon", n=3, temperature=1.0, seed=9, max_tokens=10, stop_token_ids=())
    assert len(choices) == 3 and len({tuple(c.token_ids) for c in choices}) > 1
    assert choices[0].token_ids == model.generate("once upon", temperature=1.0, seed=9, max_tokens=10,
                                                  stop_token_ids=()).token_ids
    assert choices[2].token_ids == model.generate("once upon", temperature=1.0, seed=11, max_tokens=10,
                                                  stop_token_ids=()).token_ids
    with pytest.raises(ValueError, match="n=2"):
        model.generate("x", n=2, stream=True)
