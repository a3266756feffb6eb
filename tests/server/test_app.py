"""The app in this process (no subprocess): /health 503 while the model loads and 200 after, a
failed load, and request parsing on its own (no model)."""
from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from strata.defaults import SAMPLING_DEFAULTS
from strata.engine import SamplingParams
from strata.server import APIError, ServerConfig, create_app
from strata.server.protocol import parse_chat, parse_completion


def _wait_for(client: TestClient, path: str, status: int, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = client.get(path)
        if response.status_code == status:
            return response
        time.sleep(0.02)
    raise AssertionError(f"{path} did not answer {status} within {timeout} s: {response.status_code} {response.text}")


def test_health_503_while_loading_then_200(tiny_path):
    import strata

    gate, loaded = threading.Event(), []

    def loader():
        assert gate.wait(60)
        loaded.append(strata.load(tiny_path, threads=1, max_batch=2))
        return loaded[0]

    app = create_app(loader, ServerConfig("tiny", max_running=2, max_queue=2))
    with TestClient(app) as client:
        loading = client.get("/health")
        assert loading.status_code == 503 and loading.json()["error"]["code"] == "model_loading"
        busy = client.post("/v1/completions", json={"prompt": "hi"})
        assert busy.status_code == 503 and busy.json()["error"]["code"] == "model_loading"
        assert client.get("/metrics").status_code == 200  # open while loading, no model metrics yet
        assert "strata:kv_blocks_total" not in client.get("/metrics").text
        gate.set()
        assert _wait_for(client, "/health", 200).json() == {"status": "ok", "auth": False}
        done = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, "ignore_eos": True})
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 4
        # the paged cache's pool: blocks for 2 sequences of the whole context
        assert f"strata:kv_blocks_total {float(loaded[0].cache.n_blocks)}" in client.get("/metrics").text
        assert "strata:kv_blocks_used 0.0" in client.get("/metrics").text
        worker = app.state.strata.worker
    assert not worker._thread.is_alive()  # the lifespan's end stopped the engine thread


def test_failed_load_is_503_with_the_reason(tmp_path):
    import strata

    heard = []
    app = create_app(lambda: strata.load(tmp_path / "missing.gguf"), ServerConfig("x"), on_load_error=heard.append)
    with TestClient(app) as client:
        response = _wait_for(client, "/health", 503)
        deadline = time.monotonic() + 30
        while not heard and time.monotonic() < deadline:
            time.sleep(0.02)
        response = client.get("/health")
        assert response.json()["error"]["code"] == "model_load_failed"
        assert "missing.gguf" in response.json()["error"]["message"]
    assert len(heard) == 1


def test_parse_defaults_and_aliases():
    req = parse_chat({"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                                   {"type": "text", "text": "b"}]},
                                                  {"role": "assistant", "content": None}],
                      "max_tokens": 5, "max_completion_tokens": 7, "top_k": -1, "stop": "END"})
    assert req.messages == [{"role": "system", "content": "ab"}, {"role": "assistant", "content": ""}]
    assert req.max_tokens == 7 and req.stop == ("END",) and not req.stream
    assert req.sampling == SamplingParams(**{**SAMPLING_DEFAULTS, "top_k": 0, "max_tokens": 7}, stop=("END",))
    req = parse_completion({"prompt": [[1, 2, 3]], "stream": True, "stream_options": {"include_usage": True},
                            "frequency_penalty": 0, "presence_penalty": 0.0, "n": 1, "logprobs": None})
    assert req.prompt == [1, 2, 3] and req.stream and req.include_usage and req.max_tokens is None


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "temperature": True}, "temperature"),
    ({"prompt": "x", "temperature": float("nan")}, "temperature"),
    ({"prompt": "x", "min_p": 1.5}, "min_p"),
    ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "x", "seed": 2**64}, "seed"),
    ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": "1"}, "frequency_penalty"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 17}, "n"),
    ({"prompt": "x", "n": 1.5}, "n"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "logit_bias": {"x1": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": 100.5}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": None}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": [5]}, "logit_bias"),
    ({"prompt": "x", "logit_bias": "5"}, "logit_bias"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "stop": ["a"] * 17}, "stop"),
    ({"prompt": [True, 2]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": "x", "model": 3}, "model"),
])
def test_parse_refuses(body, param):
    with pytest.raises(APIError) as info:
        parse_completion(body)
    assert info.value.status == 400 and info.value.param == param, info.value


@pytest.mark.parametrize("body, param", [
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"top_logprobs": -1, "logprobs": True}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"top_logprobs": 2, "logprobs": False}, "top_logprobs"),
    ({"top_logprobs": "2", "logprobs": True}, "top_logprobs"),
    ({"logprobs": 3}, "logprobs"),
])
def test_parse_chat_logprobs_refuses(body, param):
    with pytest.raises(APIError) as info:
        parse_chat({"messages": [{"role": "user", "content": "x"}], **body})
    assert info.value.status == 400 and info.value.param == param, info.value
    assert info.value.message.startswith(param), info.value


def test_parse_sampling_fields():
    req = parse_chat({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 3, "n": 2,
                      "frequency_penalty": 0.5, "presence_penalty": -1, "logit_bias": {"12": -100, "7": 2.5},
                      "seed": 4})
    p = req.sampling
    assert (p.logprobs, p.n, p.frequency_penalty, p.presence_penalty) == (3, 2, 0.5, -1.0)
    assert p.logit_bias == ((7, 2.5), (12, -100.0)) and req.n == 2 and p.for_choice(1).seed == 5
    assert parse_chat({"messages": [{"role": "user", "content": "x"}], "logprobs": True}).sampling.logprobs == 0
    assert parse_chat({"messages": [{"role": "user", "content": "x"}], "logprobs": False}).sampling.logprobs is None
    assert parse_completion({"prompt": "x", "logprobs": 0}).sampling.logprobs == 0


def test_fuzz_sampling_fields_are_400s_or_accepted():
    """Random values of the new fields: every body parses or is a 400 naming one of them, never another error."""
    import random

    rng = random.Random(0)
    values = [None, True, False, 0, 1, -1, 2, 5, 20, 21, 100, 101, -100.5, 0.5, 1e308, float("nan"), "1", "",
              "abc", [], [1], [[1, 2]], {}, {"1": 1}, {"-1": 1}, {"1": "x"}, {"99999999999999999999": 1},
              {"1": 1e9}, {"\u0661": 1}, {"1": True}]
    fields = ["n", "logprobs", "top_logprobs", "frequency_penalty", "presence_penalty", "logit_bias", "seed"]
    for _ in range(600):
        body = {f: rng.choice(values) for f in rng.sample(fields, rng.randint(1, 4))}
        for parse, base in ((parse_chat, {"messages": [{"role": "user", "content": "x"}]}), (parse_completion,
                                                                                             {"prompt": "x"})):
            try:
                parse({**base, **body})
            except APIError as e:
                assert e.status == 400 and e.param in fields, (body, e)


def test_grammar_vocabulary_is_built_at_start(tiny_path, monkeypatch):
    """The grammar engine's vocabulary is built on a thread once the model loads, not by the first
    constrained request (seconds on a large vocabulary); that request then waits for nothing."""
    import strata
    from strata.engine import grammar

    monkeypatch.setattr(grammar, "_VOCABULARIES", grammar.weakref.WeakKeyDictionary())
    app = create_app(lambda: strata.load(tiny_path, threads=1, max_batch=2), ServerConfig("tiny"))
    with TestClient(app) as client:
        _wait_for(client, "/health", 200)
        state = app.state.strata
        state._grammar.join(60)
        assert state.model.grammar_ready  # no request has asked for a grammar yet
        body = {"prompt": "hi", "max_tokens": 8, "grammar": 'root ::= "{" [a-z]* "}"', "seed": 1}
        text = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
        assert text.startswith("{") and text[1:].rstrip("}").isalpha()


def test_n_choices_prefill_the_prompt_once(tiny_path):
    """n=3 over HTTP: the prompt is computed once (the other choices fork from the first's KV
    cache) and each choice equals a request of its own seed."""
    import strata

    app = create_app(lambda: strata.load(tiny_path, threads=1, max_batch=4), ServerConfig("tiny"))
    body = {"prompt": "the keys and values of a long prompt", "max_tokens": 8, "temperature": 1.0, "seed": 3,
            "ignore_eos": True}
    with TestClient(app) as client:
        _wait_for(client, "/health", 200)
        model = app.state.strata.model
        before = model.engine.n_prefilled
        both = client.post("/v1/completions", json={**body, "n": 3}).json()
        n_prompt = both["usage"]["prompt_tokens"]
        assert model.engine.n_prefilled - before == n_prompt
        texts = [c["text"] for c in sorted(both["choices"], key=lambda c: c["index"])]
        alone = [client.post("/v1/completions", json={**body, "seed": 3 + i}).json()["choices"][0]["text"]
                 for i in range(3)]
        assert texts == alone and len(set(alone)) == 3


def test_requests_on_their_way_are_counted_until_submitted(tiny_path):
    """The count an idle engine gathers on goes back to 0 after every request, answered or refused
    on its way (a prompt past the context, n beyond the batch), streamed or not."""
    import strata

    app = create_app(lambda: strata.load(tiny_path, threads=1, max_batch=2, n_ctx=64),
                     ServerConfig("tiny", max_running=2, max_queue=0))
    with TestClient(app) as client:
        _wait_for(client, "/health", 200)
        worker = app.state.strata.worker
        ok = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200
        long = client.post("/v1/completions", json={"prompt": "hi " * 200, "max_tokens": 2})
        assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"
        many = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "n": 3})
        assert many.status_code == 503 and many.json()["error"]["code"] == "queue_full"
        with client.stream("POST", "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": True}) as r:
            assert r.status_code == 200 and "[DONE]" in r.read().decode()
        assert worker.n_incoming == 0 and worker.n_open == 0
