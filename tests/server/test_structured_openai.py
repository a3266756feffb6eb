"""Structured output through the official `openai` client: response_format json_object and
json_schema, and tool_choice required / named forced by a grammar, on the tiny random model served
in this process with Qwen3's real chat template (a random model follows no format: only the mask
makes these replies parse)."""
from __future__ import annotations

import json

import openai
import pytest

from .forced import client  # noqa: F401  (fixture: the served model)

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10},
    "unit": {"enum": ["C", "F"]},
    "days": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
        "day": {"type": "integer", "minimum": 1, "maximum": 7}, "tags": {"type": "array", "maxItems": 2,
                                                                         "items": {"enum": ["sun", "rain"]}}},
        "required": ["day", "tags"], "additionalProperties": False}}},
    "required": ["city", "unit", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"type": "integer"}},
    "required": ["city", "days"], "additionalProperties": False}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
             "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "weather in Paris?"}]


@pytest.mark.parametrize("seed", range(3))
def test_json_schema_reply_validates(client, seed):  # noqa: F811
    c, _ = client
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}
    r = c.chat.completions.create(model="tiny", messages=ASK, response_format=fmt, temperature=1.0, seed=seed,
                                  max_tokens=200, extra_body={"top_k": 0})
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_json_object_reply_parses(client):  # noqa: F811
    c, model = client
    quotes = {str(i): 8 for i, b in enumerate(model.tokenizer.token_bytes) if b in (b'"', b'",', b'"}', b'":')}
    r = c.chat.completions.create(model="tiny", messages=ASK, response_format={"type": "json_object"},
                                  temperature=1.0, seed=5, max_tokens=300, logit_bias=quotes)
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_uncompilable_schema_is_a_400(client):  # noqa: F811
    c, _ = client
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="tiny", messages=ASK, response_format=fmt)
    assert e.value.body["param"] == "response_format" and "objectx" in e.value.body["message"]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_tool_choice_forces_a_parsed_call(client, choice):  # noqa: F811
    c, _ = client
    for seed in range(2):
        r = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice=choice, temperature=1.0,
                                      seed=seed, max_tokens=120, parallel_tool_calls=False)
        m = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and len(m.tool_calls) == 1, m
        call = m.tool_calls[0].function
        tool = next(t for t in TOOLS if t["function"]["name"] == call.name)
        assert choice == "required" or call.name == "get_time"
        jsonschema.validate(json.loads(call.arguments), tool["function"]["parameters"])


def test_grammar_field_gbnf(client):  # noqa: F811
    c, _ = client
    r = c.completions.create(model="tiny", prompt="ok?", temperature=1.0, seed=2, max_tokens=10,
                             extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert r.choices[0].text in ("yes", "no")
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny", prompt="ok?", extra_body={"grammar": "root ::= nowhere"})
    assert e.value.body["param"] == "grammar"
