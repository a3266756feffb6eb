"""`strata serve` through the official `openai` client: chat and completions, whole and streamed,
the model list, the usage chunk, 16 concurrent streams equal to each request alone, metrics,
and a client that leaves mid-stream has its sequence cancelled."""
from __future__ import annotations

import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import ROOT, start

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
# conftest's `server` and `client`; paged memory, whose counters /metrics reports (a file that fits in
# RAM and sits in the page cache is otherwise read in place, with no expert counters)
SERVE_ARGS = ("--max-batch", "4", "--ctx", "1024", "--alias", "tiny", "--memory", "paged")


def metrics(server) -> dict[str, float]:
    """Every sample of /metrics by name and labels, e.g. 'strata:request_success_total{finished_reason=stop}'."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def test_models_list(client, tiny_path):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny"]
    assert models[0].owned_by == "strata"
    assert client.models.retrieve("tiny").id == "tiny"


def test_chat_equals_the_library(client, tiny_model):
    done = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0)
    expected = tiny_model.chat(MESSAGES, max_tokens=10, temperature=0.0)
    assert done.object == "chat.completion" and done.id.startswith("chatcmpl-")
    assert done.choices[0].message.role == "assistant"
    assert done.choices[0].message.content == expected.text
    assert done.choices[0].finish_reason == ("length" if expected.finish_reason == "length" else "stop")
    assert done.usage.prompt_tokens == expected.prompt_tokens
    assert done.usage.completion_tokens == len(expected.token_ids)
    assert done.usage.total_tokens == expected.prompt_tokens + len(expected.token_ids)


def test_chat_stream_with_usage(client):
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_text_and_token_ids(client, tiny_model):
    prompt = "The cache holds"
    expected = tiny_model.generate(prompt, max_tokens=8, temperature=0.0, stop_token_ids=())
    done = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert done.object == "text_completion" and done.choices[0].text == expected.text
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 8
    ids = tiny_model.tokenize(prompt)
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert by_ids.choices[0].text == expected.text and by_ids.usage.prompt_tokens == len(ids)
    chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert len({c.id for c in chunks}) == 1 and all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
    assert chunks[-1].usage.completion_tokens == 8 and chunks[-1].usage.prompt_tokens == len(ids)


def test_timings_as_llama_server_reports_them(client):
    """The whole answer and the stream's finish chunk carry llama-server's `timings`: prompt and
    cached tokens, the generated count, and the mean interval between generated tokens (the span
    from the first to the last over the tokens after the first), within what the client saw."""
    body = dict(model="tiny", prompt="The cache holds", max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**body).model_extra["timings"]
    t0 = time.perf_counter()
    chunks = list(client.completions.create(stream=True, **body))
    span = (time.perf_counter() - t0) * 1e3
    last = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(last) == 1 and all("timings" not in (c.model_extra or {}) for c in chunks if c is not last[0])
    streamed = last[0].model_extra["timings"]
    for t in (whole, streamed):
        assert t["predicted_n"] == 8 and t["cache_n"] + t["prompt_n"] > 0
        assert t["predicted_per_token_ms"] == pytest.approx(t["predicted_ms"] / 7)
        assert t["predicted_per_second"] == pytest.approx(7e3 / t["predicted_ms"])
    assert streamed["cache_n"] > 0  # the same prompt again: served from the prefix cache
    assert 0 < streamed["prompt_ms"] + streamed["predicted_ms"] < span

def test_stop_string_and_seeded_sampling(client):
    base = client.completions.create(model="tiny", prompt="abc", max_tokens=16, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = base[3:5]
    assert stop.strip(), base
    cut = client.completions.create(model="tiny", prompt="abc", max_tokens=16, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert cut.choices[0].text == base[:base.index(stop)] and cut.choices[0].finish_reason == "stop"
    runs = [client.completions.create(model="tiny", prompt="abc", max_tokens=16, temperature=1.0, top_p=0.9,
                                      seed=seed, extra_body={"ignore_eos": True, "top_k": 50, "min_p": 0.01,
                                                             "repetition_penalty": 1.1}).choices[0].text
            for seed in (7, 7, 8)]
    assert runs[0] == runs[1] != runs[2]


def _stream_text(client, i: int, prompt: str) -> str:
    stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=12 + i % 5, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    return "".join(c.choices[0].text for c in stream if c.choices)


def test_16_concurrent_streams_equal_each_alone(client, server):
    prompts = [" ".join(["word"] * (1 + 7 * i)) + f" number {i}" for i in range(16)]
    alone = [_stream_text(client, i, p) for i, p in enumerate(prompts)]
    before = metrics(server)
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda ip: _stream_text(client, *ip), enumerate(prompts)))
    assert together == alone
    assert len(set(alone)) > 1
    after = metrics(server)
    generated = sum(12 + i % 5 for i in range(16))
    assert after["strata:generation_tokens_total"] - before["strata:generation_tokens_total"] == generated
    assert after["strata:request_success_total{finished_reason=length}"] - \
        before.get("strata:request_success_total{finished_reason=length}", 0) == 16
    assert after["strata:time_to_first_token_seconds_count"] - before["strata:time_to_first_token_seconds_count"] == 16
    assert after["strata:inter_token_latency_seconds_count"] - \
        before["strata:inter_token_latency_seconds_count"] == generated - 16
    assert after["strata:requests_running"] == 0 and after["strata:kv_blocks_used"] == 0


def test_metrics_text_parses_and_counts(client, server, tiny_model):
    before = metrics(server)
    done = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, temperature=0)
    after = metrics(server)
    assert after["strata:prompt_tokens_total"] - before["strata:prompt_tokens_total"] == done.usage.prompt_tokens
    assert after["strata:generation_tokens_total"] - before["strata:generation_tokens_total"] == \
        done.usage.completion_tokens
    assert after["strata:expert_requests_total"] > before["strata:expert_requests_total"]
    assert after["strata:expert_hits_total{tier=device}"] + after["strata:expert_misses_total{tier=device}"] == \
        after["strata:expert_requests_total"] - after["strata:expert_late_prefetches_total"]
    assert after["strata:kv_blocks_total"] >= 4
    assert after["strata:e2e_request_latency_seconds_count"] > before["strata:e2e_request_latency_seconds_count"]


def test_disconnect_cancels_the_sequence(server):
    before = metrics(server)
    body = {"model": "tiny", "prompt": "a long story", "max_tokens": 1000, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", server.url + "/v1/completions", json=body) as response:
            assert response.status_code == 200
            events = response.iter_lines()
            got = [line for line, _ in zip((e for e in events if e.startswith("data: ")), range(3))]
            assert len(got) == 3
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = metrics(server)
        if now.get("strata:request_success_total{finished_reason=abort}", 0) > \
                before.get("strata:request_success_total{finished_reason=abort}", 0):
            break
        time.sleep(0.05)
    assert now["strata:request_success_total{finished_reason=abort}"] == \
        before.get("strata:request_success_total{finished_reason=abort}", 0) + 1
    assert now["strata:requests_running"] == 0 and now["strata:kv_blocks_used"] == 0
    assert now["strata:generation_tokens_total"] - before["strata:generation_tokens_total"] < 1000


def test_random_disconnects_leave_nothing_behind(server, client):
    rng = random.Random(0)
    plans = [(rng.randint(4, 40), rng.randint(0, 25)) for _ in range(200)]  # (max_tokens, events read before leaving)

    def one(plan):
        max_tokens, leave_after = plan
        body = {"model": "tiny", "prompt": f"story {max_tokens}", "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "ignore_eos": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            for n, _ in enumerate(response.iter_lines()):
                if n >= leave_after:
                    break

    before = metrics(server)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, plans))
    finished = lambda m: sum(v for k, v in m.items() if k.startswith("strata:request_success_total"))  # noqa: E731
    deadline = time.monotonic() + 30
    while finished(now := metrics(server)) < finished(before) + 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert finished(now) == finished(before) + 200
    for reason in ("abort", "length"):  # some clients left, some read to the end
        key = f"strata:request_success_total{{finished_reason={reason}}}"
        assert now.get(key, 0) > before.get(key, 0)
    assert now["strata:requests_running"] == 0 and now["strata:requests_waiting"] == 0
    assert now["strata:kv_blocks_used"] == 0
    assert client.completions.create(model="tiny", prompt="after", max_tokens=3, temperature=0,
                                     extra_body={"ignore_eos": True}).usage.completion_tokens == 3


def test_chat_against_the_server(server, tiny_model):
    import pexpect

    from tests.cli.test_chat import _exit, _expected_turns, _reply

    child = pexpect.spawn(sys.executable, ["-m", "strata", "chat", "--server", server.url, "--temperature", "0",
                                           "-n", "10", "--system", "Be brief."],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), encoding="utf-8", timeout=60)
    try:
        replies = [_reply(child, text) for text in ("hello there", "and the cache?")]
        _exit(child)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert [reply[:2] for reply in replies] == _expected_turns(tiny_model)
    assert replies[0][2] == 1024  # the server's context


def _long_chat(turn: str) -> list[dict]:
    system = " ".join(f"rule {i}: answer in plain words." for i in range(30))  # a few hundred tokens
    return [{"role": "system", "content": system}, {"role": "user", "content": turn}]


def test_a_repeated_system_prompt_is_served_from_the_prefix_cache(client, server, tiny_model):
    before = metrics(server)
    first = client.chat.completions.create(model="tiny", messages=_long_chat("first question"), max_tokens=4,
                                           temperature=0)
    second = client.chat.completions.create(model="tiny", messages=_long_chat("another one"), max_tokens=4,
                                            temperature=0)
    after = metrics(server)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens_details.cached_tokens < 16 <= cached < second.usage.prompt_tokens
    ids = [tiny_model.tokenize(tiny_model.apply_chat_template(_long_chat(t)), parse_special=True)
           for t in ("first question", "another one")]
    shared = next(i for i, (a, b) in enumerate(zip(*ids)) if a != b)
    assert cached == shared  # token by token, past whole KV blocks (the first one's tail block copied)
    assert after["strata:prompt_tokens_cached_total"] - before["strata:prompt_tokens_cached_total"] == \
        cached + first.usage.prompt_tokens_details.cached_tokens
    assert after["strata:prefix_cache_hits_total"] - before["strata:prefix_cache_hits_total"] == \
        cached + first.usage.prompt_tokens_details.cached_tokens
    assert after["strata:prefix_cache_blocks"] >= cached // 16


def test_no_prefix_cache_prefills_every_prompt_and_answers_the_same(request, tmp_path_factory, tiny_path, client):
    off = start(request, tmp_path_factory, tiny_path, "--max-batch", "2", "--ctx", "1024", "--alias", "tiny",
                "--no-prefix-cache")
    plain = openai.OpenAI(base_url=off.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    for turn in ("first question", "first question"):
        got = plain.chat.completions.create(model="tiny", messages=_long_chat(turn), max_tokens=6, temperature=0)
        assert got.usage.prompt_tokens_details.cached_tokens == 0
    cached = client.chat.completions.create(model="tiny", messages=_long_chat(turn), max_tokens=6, temperature=0)
    assert cached.usage.prompt_tokens_details.cached_tokens > 0
    assert got.choices[0].message.content == cached.choices[0].message.content
    assert "strata:prefix_cache_blocks" not in metrics(off)
