"""Chat prompts rendered as transformers' apply_chat_template renders them."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from strata.chat_template import ChatTemplate, ChatTemplateError

CONVERSATION = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi  there\n"},
                {"role": "assistant", "content": "Hello! ünïcödé 🦙"}, {"role": "user", "content": "And now?"}]

# Exercises what real templates use: whitespace control, loop controls, namespace, tojson with
# non-ASCII and indent, raise_exception, strftime_now, dict(), tools, slicing and filters.
RICH = """{%- set ns = namespace(system='', n=0) -%}
{%- for m in messages -%}
  {%- if m.role == 'system' %}{% set ns.system = m.content %}{% continue %}{% endif -%}
  {%- if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif -%}
  {%- set ns.n = ns.n + 1 %}
<|{{ m.role }}|>
  {{ m.content | trim }}
  {% if loop.last and m.role == 'user' %}{% break %}{% endif %}
{%- endfor %}
{% if tools %}TOOLS {{ tools | tojson(indent=2) }}{% endif %}
SYS={{ ns.system | tojson }} N={{ ns.n }} {{ dict(a=1) | tojson }} Y={{ strftime_now('%Y')[:2] }}
{%- if add_generation_prompt %}<|assistant|>{% endif %}{{ eos_token }}"""

TOOLS = [{"type": "function", "function": {"name": "météo", "parameters": {"type": "object", "properties": {}}}}]


def _special(hf) -> dict:
    return {k: getattr(hf, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}


def test_fixture_template_equals_apply_chat_template(tiny):
    hf = AutoTokenizer.from_pretrained(tiny.hf_dir)
    from strata.gguf import open_model

    source = open_model(tiny.gguf("f32")).metadata["tokenizer.chat_template"]
    ours = ChatTemplate(source, _special(hf))
    for add in (True, False):
        assert ours.render(CONVERSATION, add_generation_prompt=add) == \
            hf.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=add)


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_rich_template_equals_apply_chat_template(tiny, tools):
    hf = AutoTokenizer.from_pretrained(tiny.hf_dir)
    ours = ChatTemplate(RICH, _special(hf))
    ref = hf.apply_chat_template(CONVERSATION, tools=tools, chat_template=RICH, tokenize=False,
                                 add_generation_prompt=True)
    assert ours.render(CONVERSATION, tools=tools) == ref
    assert "météo" in ref if tools else "TOOLS" not in ref


def test_raise_exception_and_syntax_errors_are_chat_template_errors():
    with pytest.raises(ChatTemplateError, match="bad role tool"):
        ChatTemplate(RICH, {}).render([{"role": "tool", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="syntax error"):
        ChatTemplate("{% for %}", {})


def test_sandbox_refuses_internals():
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages.__class__.__mro__ }}{% set ns = namespace(_x=1) %}", {}).render([])
