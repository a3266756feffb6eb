"""Structured output through the official `openai` client: response_format json_object and
json_schema, and tool_choice required / named forced by a grammar, on the tiny random model served
in this process with Qwen3's real chat template (a random model follows no format: only the mask
makes these replies parse)."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

jsonschema = pytest.importorskip("jsonschema")

from tests.fixtures.tiny import llama_cpp_source  # noqa: E402

from .conftest import free_port  # noqa: E402

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


@pytest.mark.parametrize("seed", range(3))
def test_json_schema_reply_validates(client, seed):
    c, _ = client
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}
    r = c.chat.completions.create(model="tiny", messages=ASK, response_format=fmt, temperature=1.0, seed=seed,
                                  max_tokens=200, extra_body={"top_k": 0})
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_json_object_reply_parses(client):
    c, model = client
    quotes = {str(i): 8 for i, b in enumerate(model.tokenizer.token_bytes) if b in (b'"', b'",', b'"}', b'":')}
    r = c.chat.completions.create(model="tiny", messages=ASK, response_format={"type": "json_object"},
                                  temperature=1.0, seed=5, max_tokens=300, logit_bias=quotes)
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_uncompilable_schema_is_a_400(client):
    c, _ = client
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="tiny", messages=ASK, response_format=fmt)
    assert e.value.body["param"] == "response_format" and "objectx" in e.value.body["message"]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_tool_choice_forces_a_parsed_call(client, choice):
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


def test_grammar_field_gbnf(client):
    c, _ = client
    r = c.completions.create(model="tiny", prompt="ok?", temperature=1.0, seed=2, max_tokens=10,
                             extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert r.choices[0].text in ("yes", "no")
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny", prompt="ok?", extra_body={"grammar": "root ::= nowhere"})
    assert e.value.body["param"] == "grammar"
