"""`strata serve --api-key KEY` with a small context and queue: OpenAI-shaped errors with the
right statuses (400, 401, 404, 503), and every next good request still succeeds."""
from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import start

KEY = "sk-test-123"
CTX = 256


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, tiny_path):
    return start(request, tmp_path_factory, tiny_path, "--api-key", KEY, "--ctx", str(CTX), "--max-batch", "1",
                 "--max-queue", "1")


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as client:
        yield client


def error_of(response: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == ("invalid_request_error" if status < 500 else "server_error")
    assert error["param"] == param and error["code"] == code and error["message"]
    return error["message"]


def good(http) -> None:
    done = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "temperature": 0, "ignore_eos": True})
    assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 3


def test_api_key(server):
    health = httpx.get(server.url + "/health")  # health and metrics stay open
    assert health.status_code == 200 and health.json() == {"status": "ok", "auth": True}  # a key is wanted
    assert httpx.get(server.url + "/metrics").status_code == 200
    error_of(httpx.get(server.url + "/v1/models"), 401, code="invalid_api_key")
    error_of(httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer wrong"}), 401,
             code="invalid_api_key")
    error_of(httpx.post(server.url + "/v1/completions", json={"prompt": "x"}), 401, code="invalid_api_key")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    assert client.completions.create(model=client.models.list().data[0].id, prompt="hi", max_tokens=2).usage


@pytest.mark.parametrize("path, body, param, words", [
    ("/v1/completions", {"prompt": "x", "temperature": -1}, "temperature", ">= 0"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, "top_p", "> 0"),
    ("/v1/completions", {"prompt": "x", "top_k": 1.5}, "top_k", "integer"),
    ("/v1/completions", {"prompt": "x", "seed": -3}, "seed", "seed"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens", ">= 1"),
    ("/v1/completions", {"prompt": "x", "n": 17}, "n", "<= 16"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs", "<= 20"),
    ("/v1/completions", {"prompt": "x", "frequency_penalty": 2.5}, "frequency_penalty", "<= 2"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"1000000": 5}}, "logit_bias", "outside the vocabulary"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"1": 200}}, "logit_bias", "<= 100"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"one": 2}}, "logit_bias", "token ids"),
    ("/v1/completions", {"prompt": "x", "stop": ["", "a"]}, "stop", "non-empty"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, "stream", "true or false"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options", "stream"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt", "one prompt"),
    ("/v1/completions", {"prompt": [1, 10**9]}, "prompt", "vocabulary"),
    ("/v1/completions", {}, "prompt", "expected a string"),
    ("/v1/chat/completions", {"messages": []}, "messages", "non-empty"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "wizard"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content", "text parts"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, "top_logprobs",
     "only allowed when logprobs is true"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs", "<= 20"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 0}, "n", ">= 1"),
])
def test_bad_fields(http, path, body, param, words):
    assert words in error_of(http.post(path, json=body), 400, param=param)
    good(http)


def test_bad_json_unknown_model_and_route(http):
    assert "not valid JSON" in error_of(http.post("/v1/completions", content=b"{bad"), 400)
    assert "JSON object" in error_of(http.post("/v1/completions", json=[1, 2]), 400)
    message = error_of(http.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"}), 404, param="model",
                       code="model_not_found")
    assert "gpt-9" in message
    error_of(http.get("/v1/models/gpt-9"), 404, param="model", code="model_not_found")
    error_of(http.get("/v1/nothing"), 404)
    good(http)


def test_prompt_longer_than_the_context(http):
    message = error_of(http.post("/v1/completions", json={"prompt": [5] * CTX}), 400, param="prompt",
                       code="context_length_exceeded")
    assert str(CTX) in message
    long_chat = {"messages": [{"role": "user", "content": "word " * (2 * CTX)}]}
    error_of(http.post("/v1/chat/completions", json=long_chat), 400, param="messages", code="context_length_exceeded")
    fits = http.post("/v1/completions", json={"prompt": [5] * (CTX - 3), "max_tokens": 50, "ignore_eos": True})
    assert fits.status_code == 200 and fits.json()["choices"][0]["finish_reason"] == "length"
    assert fits.json()["usage"]["completion_tokens"] == 3  # the context ends it
    good(http)


def test_queue_full_is_503_and_others_go_on(http):
    long = {"prompt": "tell me", "max_tokens": CTX - 10, "stream": True, "ignore_eos": True, "temperature": 0}
    with http.stream("POST", "/v1/completions", json=long) as first, \
            http.stream("POST", "/v1/completions", json=long) as second:  # one running, one queued: full
        assert first.status_code == second.status_code == 200
        error_of(http.post("/v1/completions", json={"prompt": "x"}), 503, code="queue_full")
        first_lines = [line for line in first.iter_lines() if line.startswith("data: ")]
    assert first_lines[-1] == "data: [DONE]"
    good(http)  # the second was cancelled when its connection closed
