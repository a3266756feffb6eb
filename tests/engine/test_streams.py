"""A stream belongs to one sequence: interleaved streams, a stream held across a blocking
`generate`, and closing or dropping a stream each leave the other sequences' text untouched."""
from __future__ import annotations

import pytest

A, B, C = "Hello world", "The cat sat on", "Once upon"
KW = dict(temperature=0, stop_token_ids=[])  # greedy: a stream and its solo run decode the same tokens


@pytest.fixture(scope="module")
def model(loaded):
    m = loaded("qwen3moe")
    assert m.cache.n_slots >= 3
    return m


@pytest.fixture(scope="module")
def solo(model):
    return {p: model.generate(p, max_tokens=n, **KW) for p, n in ((A, 8), (B, 12), (C, 5))}


def _tokens(chunks) -> list[int]:
    return [c.token_id for c in chunks if c.token_id is not None]


def test_interleaved_streams_get_only_their_own_tokens(model, solo):
    sa, sb = model.generate(A, max_tokens=8, stream=True, **KW), model.generate(B, max_tokens=12, stream=True, **KW)
    got = {A: [], B: []}
    live = {A: iter(sa), B: iter(sb)}
    while live:
        for p in list(live):
            try:
                got[p].append(next(live[p]))
            except StopIteration:
                del live[p]
    for p, s in ((A, sa), (B, sb)):
        assert _tokens(got[p]) == solo[p].token_ids
        assert "".join(c.text for c in got[p]) == solo[p].text
        assert s.completion.token_ids == solo[p].token_ids and s.completion.finish_reason == "length"
    assert not model.engine.busy


def test_stream_held_across_a_blocking_generate(model, solo):
    sa = model.generate(A, max_tokens=8, stream=True, **KW)
    first = [next(iter(sa))]
    assert model.generate(C, max_tokens=5, **KW).token_ids == solo[C].token_ids
    rest = list(sa)
    assert _tokens(first + rest) == solo[A].token_ids
    assert sa.completion.text == solo[A].text


@pytest.mark.parametrize("how", ["close", "drop"])
def test_closing_or_dropping_one_stream_ends_only_its_sequence(model, solo, how):
    sa, sb = model.generate(A, max_tokens=8, stream=True, **KW), model.generate(B, max_tokens=12, stream=True, **KW)
    ita, itb = iter(sa), iter(sb)
    b_chunks = [next(ita) and next(itb), next(itb)]
    next(ita)
    assert len(model.engine.running) == 2
    if how == "close":
        sa.close()
    else:
        del sa, ita
    assert len(model.engine.running) == 1 and model.cache.n_free == model.cache.n_slots - 1
    b_chunks += list(itb)
    assert _tokens(b_chunks) == solo[B].token_ids
    assert sb.completion.text == solo[B].text
    assert not model.engine.busy and model.cache.n_free == model.cache.n_slots


@pytest.mark.parametrize("prompt", [None, [1.5, 2.0], ["a"], 7])
def test_bad_prompts_are_argument_errors(model, prompt):
    from strata.errors import StrataArgumentError

    with pytest.raises(StrataArgumentError, match="^prompt: expected text or a sequence of token ids"):
        model.generate(prompt, max_tokens=2)


@pytest.mark.parametrize("messages", [None, "hi", 5])
def test_bad_messages_are_argument_errors(model, messages):
    from strata.errors import StrataArgumentError

    with pytest.raises(StrataArgumentError, match="^messages: expected a list"):
        model.chat(messages, max_tokens=2)


@pytest.mark.parametrize("kwargs, name", [(dict(max_tokens=0), "max_tokens"), (dict(stop=[""]), "stop"),
                                          (dict(temperature=float("nan")), "temperature"), (dict(seed=2**70), "seed")])
def test_bad_api_arguments_name_the_argument(model, kwargs, name):
    from strata.errors import StrataArgumentError

    with pytest.raises(StrataArgumentError, match=f"^{name}: expected"):
        model.generate("Hello", **kwargs)
    assert not model.engine.busy
