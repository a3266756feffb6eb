"""Chat templates (`tokenizer.chat_template`), rendered the way transformers renders them.

Same jinja2 set-up as `apply_chat_template`: a sandboxed, immutable environment with
trim_blocks and lstrip_blocks, the loop-control extension, a `{% generation %}` block that
renders its body, a `tojson` filter that keeps non-ASCII text and takes indent/separators/
sort_keys, and the globals `raise_exception`, `strftime_now`, `dict` and `namespace`.
The special tokens' texts are passed as `bos_token`, `eos_token`, `unk_token`, `pad_token`.

Must not tokenize or touch a model: messages and token texts in, one string out.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from strata.errors import StrataError


class ChatTemplateError(StrataError):
    """The template refused the conversation (raise_exception) or could not be rendered."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; here it
    renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Namespace(jinja2.utils.Namespace):
    """jinja2's namespace() refusing underscore-prefixed attributes (no reach into internals)."""

    def __init__(*args, **kwargs):
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates may not set underscore attributes ({name!r})")


def _dict(*args, **kwargs) -> dict:
    return dict(*args, **kwargs)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_dict,
                       namespace=_Namespace)
    return env.from_string(source)


class ChatTemplate:
    """A model's chat template with its special tokens' texts."""

    def __init__(self, source: str, special_tokens: dict[str, str | None]):
        self.source = source
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
        try:
            self._template = _compile(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template: syntax error on line {e.lineno}: {e.message}") from None

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict] | None = None, documents: list[dict] | None = None, **kwargs: Any) -> str:
        """The prompt text of `messages` (dicts with 'role' and 'content'), ending with the
        assistant's turn opening when `add_generation_prompt`."""
        for m in messages:
            if not isinstance(m, dict):
                raise ChatTemplateError(f"chat messages must be dicts with 'role' and 'content', found {m!r}")
        try:
            return self._template.render(messages=[dict(m) for m in messages], tools=tools, documents=documents,
                                         add_generation_prompt=add_generation_prompt,
                                         **{**self.special_tokens, **kwargs})
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"chat template: {e}") from None


__all__ = ["ChatTemplate", "ChatTemplateError"]
