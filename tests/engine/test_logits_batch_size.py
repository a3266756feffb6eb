"""Logits and perplexity in forward passes of `batch_size` tokens (`Model.logits(ids, batch_size)`,
`strata perplexity -b N`): the same logits as one pass within rounding, one runner call per piece,
and with 1 the expert memory meets every token's experts as decoding does (requests per token, and
a miss stand-in for each miss); bad sizes are one-line refusals."""
from __future__ import annotations

import pytest
import torch

import strata
from strata.errors import StrataArgumentError
from strata.gguf import open_model
from strata.memory.budget import host_budget_for_slots
from tests.fixtures.tiny import zoo


@pytest.fixture(scope="module")
def tiny():
    return zoo().get("mixtral")


def _counting(model) -> list[int]:
    """Wrap the model's runner; the list collects each call's token count."""
    calls, run = [], model.runner

    def counted(tokens, *args, **kwargs):
        calls.append(len(tokens))
        return run(tokens, *args, **kwargs)
    model.runner = counted
    return calls


@pytest.mark.parametrize("batch_size", [1, 3, 5, 64])
def test_logits_in_pieces_match_one_pass(tiny, batch_size):
    ids = tiny.prompt_ids(13, seed=41)
    with strata.load(tiny.gguf(None), threads=1, n_ctx=64, max_batch=1, memory="direct") as m:
        whole = m.logits(ids)
        calls = _counting(m)
        got = m.logits(ids, batch_size=batch_size)
        assert calls == [min(batch_size, 13 - i) for i in range(0, 13, batch_size)]
        assert got.shape == whole.shape
        torch.testing.assert_close(got, whole, rtol=1e-4, atol=1e-4)
        assert torch.equal(got.argmax(-1), whole.argmax(-1))


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4"])
def test_bad_batch_size_is_refused(tiny, bad):
    with strata.load(tiny.gguf(None), threads=1, n_ctx=64, max_batch=1, memory="direct") as m:
        with pytest.raises(StrataArgumentError, match="batch_size"):
            m.logits(tiny.prompt_ids(4, seed=1), batch_size=bad)
        with pytest.raises(StrataArgumentError, match="batch_size"):
            m.perplexity(tiny.prompt_ids(16, seed=1), n_ctx=8, batch_size=bad)


def test_token_by_token_meets_the_experts_as_decoding(tiny):
    """One token per pass: each token acquires its own top-k (a whole pass acquires each expert
    once), and with stand-ins every miss is served by one."""
    path = tiny.gguf(None)
    with open_model(path) as mf:
        k, n_layers = mf.hparams.n_experts_used, len(mf.expert_layers)
        budget = host_budget_for_slots(mf, k) * 4  # room for the stand-ins and k slots a layer
    ids = tiny.prompt_ids(16, seed=43)
    kw = dict(threads=1, n_ctx=64, max_batch=1, memory="paged", host_mem=budget, miss_stand_in="q2_k")
    with strata.load(path, **kw) as m:
        m.perplexity(ids, n_ctx=16, batch_size=1)
        t = m.memory_stats().totals()
        assert t["requests"] == 16 * k * n_layers
        assert t["stand_ins"] == t["device_misses"] > 0
        m.memory_stats().reset()
        m.perplexity(ids, n_ctx=16)
        assert m.memory_stats().totals()["requests"] < 16 * k * n_layers
