"""Tool calls and reasoning end to end through the official `openai` client: the tiny model served
in this process with Qwen3's real chat template (`chat_template=`, as --chat-template-file gives
it), its output forced to a reply with reasoning and a tool call by patching the sampler (the
engine, the tokenizer's stream decoder and the server run unchanged: tests/server/forced.py)."""
from __future__ import annotations

import json

import openai
import pytest

from .forced import REPLY, client, forced  # noqa: F401  (fixtures: the served model, the forced reply)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
ASK = [{"role": "user", "content": "weather in Paris?"}]


def test_tool_call_and_reasoning_whole(forced):  # noqa: F811
    done = forced.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=200)
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] == "The user wants the weather.\n"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris", "days": 2}
    assert call.id.startswith("call_")


def test_tool_call_streamed_and_fed_back(forced):  # noqa: F811
    chunks = list(forced.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=200, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert reasoning == "The user wants the weather.\n"
    parts = [tc for d in deltas for tc in d.tool_calls or ()]
    assert parts[0].id and parts[0].function.name == "get_weather" and len(parts) == 1  # sent whole once closed
    assert json.loads("".join(p.function.arguments or "" for p in parts)) == {"city": "Paris", "days": 2}
    assert not "".join(d.content or "" for d in deltas).strip()
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    follow = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": parts[0].id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": parts[0].id, "content": "sunny, 21 C"}]
    again = forced.chat.completions.create(model="tiny", messages=follow, tools=TOOLS, max_tokens=200)
    assert again.usage.prompt_tokens > 0 and again.choices[0].message.tool_calls


def test_tool_choice_none_and_inline_reasoning(forced):  # noqa: F811
    done = forced.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=200,
                                          extra_body={"reasoning_format": "none"})
    assert done.choices[0].message.content == REPLY and not done.choices[0].message.tool_calls
    assert done.choices[0].finish_reason == "stop"


def test_unknown_named_function_is_a_400(client):  # noqa: F811
    with pytest.raises(openai.BadRequestError) as e:
        client[0].chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=4,
                                          tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice"


def test_n_choices_each_call_tools_with_logprobs(forced):  # noqa: F811
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
