"""A hostile chat template is refused or stopped with a ChatTemplateError, within bounds of time,
output size and recursion, and never escapes the sandbox; a broken template fails `chat` only,
not loading or `generate`."""
from __future__ import annotations

import time

import pytest

import strata
from strata.chat_template import ChatTemplate, ChatTemplateError, Limits
from tests.fixtures.rewrite import V, rewrite
from tests.fixtures.tiny import zoo

MESSAGES = [{"role": "user", "content": "hi"}]
FAST = Limits(max_seconds=1.0)


@pytest.mark.parametrize("source, match", [
    ("{% include 'x.jinja' %}", "include is not allowed"),
    ("{% import 'm.jinja' as m %}", "import is not allowed"),
    ("{% from 'm.jinja' import x %}", "fromimport is not allowed"),
    ("{% extends 'base.jinja' %}", "extends is not allowed"),
    ("{% if true %}" * 3000 + "{% endif %}" * 3000, "nested too deeply"),
    ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "nested too deeply"),
])
def test_refused_at_compile(source, match):
    with pytest.raises(ChatTemplateError, match=match):
        ChatTemplate(source, {})


@pytest.mark.parametrize("source", [5, ["{{ x }}"], None, b"{{ x }}"])
def test_non_string_template_is_refused(source):
    with pytest.raises(ChatTemplateError, match=r"metadata key 'tokenizer.chat_template': expected a string"):
        ChatTemplate(source, {})


def test_invalid_utf8_template_is_refused():
    with pytest.raises(ChatTemplateError, match="not valid UTF-8"):
        ChatTemplate("{{ x }}\udcfe", {})


@pytest.mark.parametrize("source, match", [
    ("{{ raise_exception('refused') }}", "refused"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{{ 'a' + 1 }}", "TypeError"),
    ("{{ messages[99]['content'] }}", "chat template"),
    ("{{ 'x' * 1000000000 }}", "too long"),
    ("{{ 1000000000 * 'x' }}", "too long"),
    ("{{ messages | tojson(indent=1000000000) }}", "filter tojson: argument 1000000000 is too large"),
    ("{{ messages | tojson(indent=100) }}", "tojson indent: expected 0 to 64"),
    ("{{ 'x' | center(1000000000) }}", "too large"),
    ("{{ '%999999999s' % 1 }}", "chat template"),
    ("{{ 9 ** 99999999 }}", "exponent 99999999 is too large"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "too long"),
    ("{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}", "too long"),
    ("{% for i in range(100000) %}{{ 'y' * 100000 }}{% endfor %}", "longer than"),
    ("{{ range(100000) | join('x' * 10000) }}", "too long"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "longer than 1 s"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "chat template"),
    ("{{ cycler.__init__.__globals__.os.system('true') }}", "chat template"),
])
def test_stopped_while_rendering(source, match):
    # the size limits are tested under the default time limit: on a loaded machine the 1 s one
    # could stop a render before its size check does
    limits = FAST if match == "longer than 1 s" else Limits()
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match=match):
        ChatTemplate(source, {}, limits).render(MESSAGES)
    assert time.monotonic() - t0 < 10


def test_limits_leave_ordinary_templates_alone():
    source = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}{{ messages | tojson(indent=2) | length }}"
              "{% endfor %}{{ 'ab' * 3 }}{{ 2 ** 10 }}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    out = ChatTemplate(source, {}).render(MESSAGES)
    assert out == "<|user|>hi" + str(len('[\n  {\n    "role": "user",\n    "content": "hi"\n  }\n]')) \
        + "ababab1024<|assistant|>"


def test_render_restores_the_previous_trace_function():
    import sys

    seen = []

    def tracer(frame, event, arg):
        seen.append(event)

    sys.settrace(tracer)
    try:
        ChatTemplate("{{ 1 }}", {}).render(MESSAGES)
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)


def test_broken_template_fails_chat_not_load_or_generate(tmp_path):
    src = zoo().get("qwen3moe").gguf(None)
    bad = rewrite(src, tmp_path / "deep.gguf", {"tokenizer.chat_template": ("{% if true %}" * 3000, V.STRING)})
    with strata.load(bad, threads=1, n_ctx=64) as model:
        assert len(model.generate("Hello", temperature=0, max_tokens=2).token_ids) == 2
        with pytest.raises(ChatTemplateError, match=r"deep.gguf: chat template: nested too deeply"):
            model.chat(MESSAGES, max_tokens=2)
