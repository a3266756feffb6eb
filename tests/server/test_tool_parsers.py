"""Each tool-call family's parser on the text its real chat template (llama.cpp's models/templates/)
writes for an assistant turn with two calls; streamed a character at a time, the deltas add up
to the whole reply. Reasoning split, and the 400s of malformed tool fields."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from strata.chat_template import ChatTemplate
from strata.server.errors import APIError
from strata.server.reasoning import ThinkSplitter
from strata.server.tools import detect, parser
from strata.server.tools.request import ToolRequest, tool_request
from strata.server.tools.stream import OutputStream, output_stream
from tests.fixtures.tiny import llama_cpp_source

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}, "days": {"type": "integer"}}}}}]
CALLS = [("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "Oslo", "days": 1})]
#: template file -> (family, text the assistant turn starts after, text it ends before)
TEMPLATES = {
    "Qwen-Qwen3-0.6B.jinja": ("hermes", "<|im_start|>assistant\n", "<|im_end|>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("hermes", "<|im_start|>assistant\n", "<|im_end|>"),
    "Qwen3-Coder.jinja": ("qwen3-coder", "<|im_start|>assistant\n", "<|im_end|>"),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("deepseek", "<｜Assistant｜><think></think>", "<｜end▁of▁sentence｜>"),
    "GLM-4.6.jinja": ("glm", "<|assistant|>\n<think></think>\n", "<|observation|>"),
    "moonshotai-Kimi-K2.jinja": ("kimi", "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>"),
    "unsloth-mistral-Devstral-Small-2507.jinja": ("mistral", "[/INST]", "</s>"),
    "openai-gpt-oss-120b.jinja": ("harmony", "<|start|>assistant", "<|start|>functions"),
}


def template(name: str) -> str:
    src = llama_cpp_source()
    if src is None:
        pytest.skip("llama.cpp's source (STRATA_LLAMA_CPP_SRC) is not here")
    return (Path(src) / "models" / "templates" / name).read_text(encoding="utf-8")


def assistant_text(name: str, calls) -> str:
    """The assistant turn the template renders for `calls` (between its start and end markers)."""
    _, start, end = TEMPLATES[name]
    ids = ("abcdefgh1", "abcdefgh2")  # 9 letters and digits: Mistral's templates insist
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                    for i, (n, a) in zip(ids, calls)]},
                {"role": "tool", "tool_call_id": ids[0], "content": "sunny"}]
    text = ChatTemplate(template(name), {"bos_token": "<s>", "eos_token": "</s>"}).render(messages, tools=TOOLS)
    first = text.index(start, text.index("weather?"))
    body = text[first + len(start):]
    return body[:body.index(end)]


def streamed(out: OutputStream, text: str) -> dict:
    """The message a client assembles from the deltas of `text` pushed a character at a time."""
    deltas = [d for ch in text for d in out.push(ch)] + out.finish()
    calls: dict[int, dict] = {}
    for d in deltas:
        for c in d.get("tool_calls", ()):
            entry = calls.setdefault(c["index"], {"id": c.get("id"), "name": "", "arguments": ""})
            entry["name"] += c["function"].get("name", "")
            entry["arguments"] += c["function"]["arguments"]
    return {"content": "".join(d.get("content", "") for d in deltas),
            "reasoning": "".join(d.get("reasoning_content", "") for d in deltas),
            "calls": [(c["name"], json.loads(c["arguments"])) for c in calls.values()]}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_family_parses_its_templates_calls(name):
    family = TEMPLATES[name][0]
    assert detect(template(name)) == family
    calls = CALLS[:1] if family == "harmony" else CALLS  # gpt-oss's template writes one call per message
    text = assistant_text(name, calls)
    whole = OutputStream(parser(family, TOOLS), None)
    whole.text = text
    message = whole.message()
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]
    assert got == calls, text
    assert not (message["content"] or "").strip()
    assert all(c["id"] and c["type"] == "function" for c in message["tool_calls"])
    stream = streamed(OutputStream(parser(family, TOOLS), None), text)
    assert stream["calls"] == calls and not stream["content"].strip()


def test_content_before_a_call_and_plain_replies():
    out = OutputStream(parser("hermes"), None)
    out.text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    m = out.message()
    assert m["content"] == "Let me check.\n" and json.loads(m["tool_calls"][0]["function"]["arguments"]) == {"city": "Rome"}
    for family in ("hermes", "deepseek", "kimi", "glm", "qwen3-coder", "mistral", "llama3", "harmony"):
        plain = streamed(OutputStream(parser(family), None), "No tools needed: 2 < 3 [ok] {fine}")
        assert plain == {"content": "No tools needed: 2 < 3 [ok] {fine}", "reasoning": "", "calls": []}, family


def test_a_call_streams_whole_once_closed():
    """No part of a call goes out before its syntax closes (a reply cut by its token limit inside a
    call must not have sent half of it): then the whole call, in one delta."""
    out = OutputStream(parser("deepseek"), None)
    head = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
    assert [d for t in (head, '{"city"', ': "Pa', 'ris"}') for d in out.push(t)] == []
    (delta,) = out.push("<｜tool▁call▁end｜>")
    (call,) = delta["tool_calls"]
    assert call["id"] and call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_think_reasoning_split_and_inline():
    text = "<think>\nThe user wants weather.\n</think>\n\nIt is sunny."
    split = streamed(OutputStream(None, ThinkSplitter()), text)
    assert split == {"content": "It is sunny.", "reasoning": "The user wants weather.\n", "calls": []}
    opened = streamed(OutputStream(None, ThinkSplitter(open_in_prompt=True)), "hmm</think>ok")
    assert opened["reasoning"] == "hmm" and opened["content"] == "ok"
    inline = output_stream(ToolRequest(), "{{ messages }}", "", reasoning_format="none")
    assert streamed(inline, text)["content"] == text


def test_harmony_analysis_is_reasoning():
    text = "<|channel|>analysis<|message|>Think first.<|end|><|start|>assistant<|channel|>final<|message|>Hello!"
    out = streamed(output_stream(ToolRequest(), "<|channel|>", ""), text)
    assert out == {"content": "Hello!", "reasoning": "Think first.", "calls": []}
    inline = streamed(output_stream(ToolRequest(), "<|channel|>", "", reasoning_format="none"), text)
    assert inline["content"] == "Think first.Hello!" and inline["reasoning"] == ""


def test_parallel_tool_calls_false_keeps_the_first():
    text = assistant_text("Qwen-Qwen3-0.6B.jinja", CALLS)
    tools = ToolRequest(TOOLS, parallel=False)
    out = output_stream(tools, template("Qwen-Qwen3-0.6B.jinja"), "")
    out.text = text
    assert len(out.message()["tool_calls"]) == 1


@pytest.mark.parametrize("body, param", [
    ({"tools": "x"}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_bad_tool_fields_are_400s_naming_the_field(body, param):
    with pytest.raises(APIError) as e:
        tool_request(body)
    assert e.value.status == 400 and e.value.param == param


def test_tool_choice_forms():
    assert tool_request({"tools": TOOLS}).choice == "auto"
    assert not tool_request({"tools": TOOLS, "tool_choice": "none"}).parse_calls
    named = tool_request({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert (named.choice, named.named, named.parse_calls) == ("named", "get_weather", True)
