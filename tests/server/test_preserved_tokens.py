"""A chat's text leaves out control tokens except those spelling its family's markup (llama-server's
"preserved tokens"): every family's tool call, written with its markers as control tokens (harmony's
are user-defined, as llama.cpp's loader makes them) between stray control tokens, decodes to the
call's text without the stray ones and parses."""
from __future__ import annotations

import json

import pytest

from strata.server.reasoning import CLOSE, OPEN
from strata.server.tools import FAMILIES, parser
from strata.tokenizer import Tokenizer
from tests.tokenizer.fixtures import byte_level_metadata

CALLS = {
    "hermes": '<tool_call>\n{"name": "get", "arguments": {"a": 1}}\n</tool_call>',
    "glm": "<tool_call>get\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
    "qwen3-coder": "<tool_call>\n<function=get>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
    "deepseek": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get<｜tool▁sep｜>{"a": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "kimi": ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get:0<|tool_call_argument_begin|>{"a": 1}'
             "<|tool_call_end|><|tool_calls_section_end|>"),
    "mistral": '[TOOL_CALLS]get[ARGS]{"a": 1}',
    "llama3": '<|python_tag|>{"name": "get", "parameters": {"a": 1}}',
    "harmony": ("<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary "
                'to=functions.get <|constrain|>json<|message|>{"a": 1}<|call|>'),
}
STRAY = "<|stray|>"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    markup = {m for cls in FAMILIES.values() for m in cls.markup} | {OPEN, CLOSE, STRAY}
    return Tokenizer.from_metadata(byte_level_metadata(sorted(markup)), "markup.gguf")


def test_every_family_is_sampled_and_names_its_start_markers():
    assert set(CALLS) == set(FAMILIES)
    for name, cls in FAMILIES.items():
        assert set(cls.starts) <= set(cls.markup), name


@pytest.mark.parametrize("family", sorted(CALLS))
def test_markup_kept_stray_control_token_left_out(tokenizer, family):
    reply = STRAY + f"{OPEN}a plan{CLOSE}" + CALLS[family] + STRAY
    ids = tokenizer.encode(reply, add_special=False)
    assert tokenizer.control_ids([STRAY]) <= set(ids)
    keep = tokenizer.control_ids((*FAMILIES[family].markup, OPEN, CLOSE))
    stream = tokenizer.stream(skip_special=True, keep=keep)
    text = "".join(stream.push(i) for i in ids) + stream.flush()
    assert text == f"{OPEN}a plan{CLOSE}" + CALLS[family]
    parsed = parser(family).parse(text.removeprefix(f"{OPEN}a plan{CLOSE}"))
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("get", {"a": 1})]
    plain = tokenizer.stream(skip_special=True)  # nothing kept: the markup that is control is lost
    lost = "".join(plain.push(i) for i in ids)
    assert lost != text if tokenizer.control_ids(FAMILIES[family].markup) else lost == text
