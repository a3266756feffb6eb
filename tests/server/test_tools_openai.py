"""Tool calls and reasoning end to end through the official `openai` client: the tiny model served
in this process with Qwen3's real chat template (`chat_template=`, as --chat-template-file gives
it), its output forced to a reply with reasoning and a tool call by patching the sampler (the
engine, the tokenizer's stream decoder and the server run unchanged)."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from strata.engine.sampling import Sampler
from tests.fixtures.tiny import llama_cpp_source

from .conftest import free_port

REPLY = ('<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n'
         '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>')
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
ASK = [{"role": "user", "content": "weather in Paris?"}]


@pytest.fixture(scope="module")
def client(tiny_path):
    src = llama_cpp_source()
    if src is None:
        pytest.skip("llama.cpp's source (STRATA_LLAMA_CPP_SRC) is not here")
    import uvicorn

    import strata
    from strata.server import ServerConfig, create_app

    template = (Path(src) / "models/templates/Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    models = []

    def loader():
        models.append(strata.load(tiny_path, threads=1, n_ctx=1024, max_batch=2, chat_template=template))
        return models[0]

    app = create_app(loader, ServerConfig("tiny"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120), models[0]
    server.should_exit = True
    thread.join(30)


@pytest.fixture
def forced(client, monkeypatch):
    """Every sequence's sampler emits REPLY's tokens, then the end-of-generation token."""
    model = client[1]
    ids = model.tokenize(REPLY, add_special=False) + [min(model.stop_token_ids)]
    assert model.detokenize(ids[:-1]) == REPLY

    def draw(self, logits):  # the engine samples through sample_batch, one draw per sequence
        self.n_forced = getattr(self, "n_forced", -1) + 1
        return ids[min(self.n_forced, len(ids) - 1)]

    monkeypatch.setattr(Sampler, "draw", draw)
    return client[0]


def test_tool_call_and_reasoning_whole(forced):
    done = forced.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=200)
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] == "The user wants the weather.\n"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris", "days": 2}
    assert call.id.startswith("call_")


def test_tool_call_streamed_and_fed_back(forced):
    chunks = list(forced.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=200, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert reasoning == "The user wants the weather.\n"
    parts = [tc for d in deltas for tc in d.tool_calls or ()]
    assert parts[0].id and parts[0].function.name == "get_weather" and len(parts) > 2  # arguments in pieces
    assert json.loads("".join(p.function.arguments or "" for p in parts)) == {"city": "Paris", "days": 2}
    assert not "".join(d.content or "" for d in deltas).strip()
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    follow = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": parts[0].id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": parts[0].id, "content": "sunny, 21 C"}]
    again = forced.chat.completions.create(model="tiny", messages=follow, tools=TOOLS, max_tokens=200)
    assert again.usage.prompt_tokens > 0 and again.choices[0].message.tool_calls


def test_tool_choice_none_and_inline_reasoning(forced):
    done = forced.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=200,
                                          extra_body={"reasoning_format": "none"})
    assert done.choices[0].message.content == REPLY and not done.choices[0].message.tool_calls
    assert done.choices[0].finish_reason == "stop"


def test_unknown_named_function_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client[0].chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=4,
                                          tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice"


def test_n_choices_each_call_tools_with_logprobs(forced):
    """n=2: each choice has its own OutputStream (reasoning and calls parsed per choice), its own
    finish reason and its own log-probabilities, streamed and whole."""
    chunks = list(forced.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=200, n=2,
                                                 stream=True, logprobs=True, top_logprobs=2))
    by_index = {0: [], 1: []}
    for c in chunks:
        for choice in c.choices:
            by_index[choice.index].append(choice)
    for index, choices in by_index.items():
        deltas = [ch.delta for ch in choices]
        parts = [tc for d in deltas for tc in d.tool_calls or ()]
        assert parts[0].function.name == "get_weather", index
        assert json.loads("".join(p.function.arguments or "" for p in parts)) == {"city": "Paris", "days": 2}
        assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == \
            "The user wants the weather.\n"
        assert [ch.finish_reason for ch in choices if ch.finish_reason] == ["tool_calls"]
        tokens = [t for ch in choices if ch.logprobs for t in ch.logprobs.content]
        assert "".join(t.token for t in tokens) == REPLY  # every token once, the held-back ones too
        assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in tokens)
    ids = {tc.id for ch in by_index[0] + by_index[1] for tc in ch.delta.tool_calls or () if tc.id}
    assert len(ids) == 2  # one call per choice, each with its own id
    done = forced.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=200, n=2, logprobs=True)
    assert [c.index for c in done.choices] == [0, 1]
    for c in done.choices:
        assert c.finish_reason == "tool_calls" and c.message.content is None
        assert c.message.tool_calls[0].function.name == "get_weather"
        assert "".join(t.token for t in c.logprobs.content) == REPLY
