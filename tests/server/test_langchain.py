"""LangChain's `ChatOpenAI` with a bound tool against the real server: the tiny model with Qwen3's
template, its output forced to a reply with reasoning and a tool call (tests/server/forced.py's
fixtures: the sampler patched, the engine, decoder and server unchanged). LangChain reads the
call back whole and streamed, and a `ToolMessage` goes back through the template."""
from __future__ import annotations

import pytest

from .forced import client, forced  # noqa: F401  (fixtures: the served model, the forced reply)

langchain_openai = pytest.importorskip("langchain_openai", reason="langchain-openai is not installed (the test extra)")
messages = pytest.importorskip("langchain_core.messages")
tools = pytest.importorskip("langchain_core.tools")


@tools.tool
def get_weather(city: str, days: int) -> str:
    """The weather forecast for a city, for a number of days."""
    return f"sunny in {city} for {days} days"


def chat(openai_client):
    return langchain_openai.ChatOpenAI(base_url=str(openai_client.base_url), api_key="x", model="tiny",
                                       max_tokens=200, max_retries=0, timeout=120)


def test_bound_tool_call_whole_and_fed_back(forced):  # noqa: F811
    llm = chat(forced).bind_tools([get_weather])
    reply = llm.invoke("weather in Paris?")
    assert isinstance(reply, messages.AIMessage) and not reply.content
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris", "days": 2} and call["id"]
    assert reply.response_metadata["finish_reason"] == "tool_calls"
    assert get_weather.invoke(call["args"]) == "sunny in Paris for 2 days"
    result = messages.ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    again = llm.invoke([messages.HumanMessage("weather in Paris?"), reply, result])
    assert again.tool_calls and again.usage_metadata["input_tokens"] > 0


def test_bound_tool_call_streamed(forced):  # noqa: F811
    chunks = list(chat(forced).bind_tools([get_weather]).stream("weather in Paris?"))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole = whole + chunk
    assert len([c for c in chunks if c.tool_call_chunks]) == 1  # the call came whole, once closed
    (call,) = whole.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris", "days": 2}
    assert not (whole.content or "").strip()
