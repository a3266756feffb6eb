"""The sampling options through the official `openai` client against `strata serve`: logprobs
(chat and completions, whole and streamed, equal to the library's), frequency/presence
penalties, logit_bias, n choices, a seeded request alone and beside others, and a stop string
split across two tokens that stops a stream without leaking its first part."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

MESSAGES = [{"role": "user", "content": "hello there"}]
IGNORE_EOS = {"ignore_eos": True}
SERVE_ARGS = ("--max-batch", "4", "--ctx", "512", "--alias", "m")  # conftest's `server` and `client`


def test_chat_logprobs_equal_the_library_whole_and_streamed(client, tiny_model):
    options = dict(model="m", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3,
                   extra_body=IGNORE_EOS)
    done = client.chat.completions.create(**options)
    expected = tiny_model.chat(MESSAGES, max_tokens=6, temperature=0.0, logprobs=3, stop_token_ids=())
    content = done.choices[0].logprobs.content
    assert len(content) == len(expected.token_ids) == 6
    for entry, lp in zip(content, expected.logprobs):
        assert bytes(entry.bytes) == tiny_model.tokenizer.token_bytes[lp.token_id]
        assert entry.logprob == pytest.approx(lp.logprob, abs=1e-5)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx([v for _, v in lp.top], abs=1e-5)
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)  # greedy: the top token
    assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace") == done.choices[0].message.content
    chunks = list(client.chat.completions.create(**options, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    # the same entries (the repeated prompt comes from the prefix cache: its last token alone is
    # computed, a batch of another shape, so log-probabilities agree to float rounding)
    assert [(e.token, e.bytes, [t.token for t in e.top_logprobs]) for e in streamed] == \
        [(e.token, e.bytes, [t.token for t in e.top_logprobs]) for e in content]
    assert [[e.logprob] + [t.logprob for t in e.top_logprobs] for e in streamed] == \
        [pytest.approx([e.logprob] + [t.logprob for t in e.top_logprobs], abs=1e-5) for e in content]
    plain = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_lists(client, tiny_model):
    done = client.completions.create(model="m", prompt="The cache", max_tokens=8, temperature=0, logprobs=2,
                                     extra_body=IGNORE_EOS)
    lp = done.choices[0].logprobs
    expected = tiny_model.generate("The cache", max_tokens=8, temperature=0.0, logprobs=2, stop_token_ids=())
    assert lp.token_logprobs == pytest.approx([r.logprob for r in expected.logprobs], abs=1e-5)
    assert all(len(top) <= 2 and max(top.values()) == pytest.approx(v) for top, v in zip(lp.top_logprobs,
                                                                                          lp.token_logprobs))
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    stream = client.completions.create(model="m", prompt="The cache", max_tokens=8, temperature=0, logprobs=2,
                                       stream=True, extra_body=IGNORE_EOS)
    parts = [c.choices[0].logprobs for c in stream if c.choices and c.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [o for p in parts for o in p.text_offset] == lp.text_offset


def test_penalties_equal_the_library(client, tiny_model):
    # The tiny random model rarely repeats itself: negative penalties (rewards) make it repeat
    options = dict(max_tokens=16, temperature=0.0, frequency_penalty=-2.0, presence_penalty=-2.0)
    done = client.completions.create(model="m", prompt="abc abc abc", extra_body=IGNORE_EOS, **options)
    expected = tiny_model.generate("abc abc abc", stop_token_ids=(), **options)
    plain = tiny_model.generate("abc abc abc", stop_token_ids=(), max_tokens=16, temperature=0.0)
    assert done.choices[0].text == expected.text
    assert expected.token_ids != plain.token_ids  # the penalties changed the greedy path
    assert len(set(expected.token_ids)) < len(set(plain.token_ids))


def test_logit_bias_forces_a_token_and_bad_ids_are_400(client, tiny_model):
    token = tiny_model.tokenize("cache", add_special=False)[0]
    text = tiny_model.detokenize([token])
    done = client.completions.create(model="m", prompt="hi", max_tokens=5, temperature=0.9, seed=1,
                                     logit_bias={str(token): 100}, extra_body=IGNORE_EOS)
    assert done.choices[0].text == text * 5
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="m", prompt="hi", max_tokens=2, logit_bias={"10000000": 1})
    assert info.value.body["param"] == "logit_bias" and "vocabulary" in info.value.body["message"]


def test_completion_text_leaves_out_control_tokens_as_llama_server_does(client, tiny_model):
    """A control token (here the end-of-text token, forced past ignore_eos) is counted and has
    log-probabilities but no text in a completion, whole or streamed."""
    eos = tiny_model.tokenizer.special.eos
    assert tiny_model.tokenizer.is_special(eos) and tiny_model.detokenize([eos])
    options = dict(model="m", prompt="hi", max_tokens=4, temperature=0, logit_bias={str(eos): 100},
                   extra_body=IGNORE_EOS)
    done = client.completions.create(logprobs=1, **options)
    assert done.usage.completion_tokens == 4 and len(done.choices[0].logprobs.tokens) == 4
    assert done.choices[0].text == ""
    chunks = list(client.completions.create(stream=True, **options))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ""
    chat = dict(model="m", messages=MESSAGES, max_tokens=4, temperature=0, logit_bias={str(eos): 100},
                extra_body=IGNORE_EOS)
    answer = client.chat.completions.create(**chat)  # a chat's too: the control token is no markup
    assert answer.usage.completion_tokens == 4 and answer.choices[0].message.content == ""
    chunks = list(client.chat.completions.create(stream=True, **chat))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""

def test_n_choices_whole_and_streamed(client):
    options = dict(model="m", prompt="once upon", max_tokens=10, temperature=1.0, seed=42, extra_body=IGNORE_EOS)
    done = client.completions.create(n=3, **options)
    assert [c.index for c in done.choices] == [0, 1, 2] and len({c.text for c in done.choices}) > 1
    assert done.usage.completion_tokens == 30
    assert done.choices[0].text == client.completions.create(**options).choices[0].text
    assert done.choices[2].text == client.completions.create(**{**options, "seed": 44}).choices[0].text
    texts = ["", "", ""]
    for c in client.completions.create(n=3, stream=True, **options):
        for choice in c.choices:
            texts[choice.index] += choice.text
    assert texts == [c.text for c in done.choices]
    chat = client.chat.completions.create(model="m", messages=MESSAGES, n=2, max_tokens=5, temperature=1.0, seed=3)
    assert [c.index for c in chat.choices] == [0, 1]


def test_seeded_request_alone_equals_beside_others(client):
    def seeded(prompt: str, seed: int) -> str:
        return client.completions.create(model="m", prompt=prompt, max_tokens=14, temperature=1.0, seed=seed,
                                         frequency_penalty=0.3, extra_body=IGNORE_EOS).choices[0].text

    alone = seeded("the seeded one", 77)
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda a: seeded(*a), [("other one", 1), ("the seeded one", 77), ("another", 2),
                                                    ("yet another prompt", 3)]))
    assert runs[1] == alone


def test_stop_string_split_across_tokens_stops_the_stream_without_leaking(client, tiny_model):
    expected = tiny_model.generate("The cache holds", max_tokens=24, temperature=0.0, stop_token_ids=())
    pieces = [tiny_model.detokenize([t]) for t in expected.token_ids]
    k = next(k for k in range(1, len(pieces) - 1) if len(pieces[k]) >= 2 and len(pieces[k + 1]) >= 2
             and (pieces[k][-2:] + pieces[k + 1][:2]) not in "".join(pieces[:k + 1]))
    stop = pieces[k][-2:] + pieces[k + 1][:2]  # ends token k, begins token k + 1
    text = "".join(pieces)
    chunks = [c.choices[0].text for c in client.completions.create(
        model="m", prompt="The cache holds", max_tokens=24, temperature=0, stop=[stop], stream=True,
        extra_body=IGNORE_EOS) if c.choices]
    assert "".join(chunks) == text[:text.index(stop)]  # nothing of the stop string leaked into the stream
