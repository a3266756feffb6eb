"""One check of token ids for every call that takes them: `tokenize`'s output, `detokenize`,
`logits` and `generate` refuse an id outside the vocabulary with the same one-line StrataError
(the README's example once passed ids beyond the demo's vocabulary and got three behaviours)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from strata.errors import StrataArgumentError, StrataError


@pytest.fixture(scope="module")
def model(loaded):
    return loaded("qwen3moe")


def _calls(model):
    return {"detokenize": model.detokenize, "logits": model.logits,
            "generate": lambda ids: model.generate(ids, max_tokens=1)}


@pytest.mark.parametrize("bad", ["past_end", "negative"])
@pytest.mark.parametrize("call", ["detokenize", "logits", "generate"])
def test_out_of_range_ids_get_generates_one_line_error(model, call, bad):
    n = model.tokenizer.vocab_size
    t = n + 7 if bad == "past_end" else -1
    with pytest.raises(StrataError) as e:
        _calls(model)[call]([1, t, 2])
    assert str(e.value) == f"token id {t} is outside the vocabulary [0, {n})"
    assert type(e.value) is StrataError  # the same class from every call, not an IndexError


@pytest.mark.parametrize("call", ["detokenize", "logits"])
def test_ids_at_the_edges_and_of_other_integer_types_are_accepted(model, call):
    n = model.tokenizer.vocab_size
    ids = [0, n - 1]
    want = _calls(model)[call](ids)
    for other in (np.array(ids, dtype=np.int64), torch.tensor(ids), (np.int32(0), n - 1)):
        got = _calls(model)[call](other)
        assert (got == want) if isinstance(got, str) else torch.equal(got, want)


@pytest.mark.parametrize("call", ["detokenize", "logits"])
def test_non_integer_ids_are_argument_errors(model, call):
    with pytest.raises(StrataArgumentError, match=f"^{call}: expected a sequence of token ids"):
        _calls(model)[call]([1, 2.5])
    with pytest.raises(StrataArgumentError, match=f"^{call}: expected a sequence of token ids"):
        _calls(model)[call]("hello")


def test_tokenize_checks_its_input_and_output(model, monkeypatch):
    with pytest.raises(StrataArgumentError, match="^tokenize: expected text"):
        model.tokenize([1, 2])
    ids = model.tokenize("the router")
    assert model.check_token_ids(ids) == ids
    n = model.tokenizer.vocab_size
    monkeypatch.setattr(model.tokenizer, "encode", lambda *a, **kw: [1, n])  # a tokenizer past its own list
    with pytest.raises(StrataError, match=rf"^token id {n} is outside the vocabulary \[0, {n}\)$"):
        model.tokenize("x")


def test_round_trip_of_valid_ids(model):
    ids = model.tokenize("a model of experts", add_special=False)
    assert model.detokenize(ids) == "a model of experts"
    assert model.logits(ids).shape == (len(ids), model.tokenizer.vocab_size)
