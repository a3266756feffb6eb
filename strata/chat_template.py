"""Chat templates (`tokenizer.chat_template`), rendered the way transformers renders them.

Same jinja2 set-up as `apply_chat_template`: a sandboxed, immutable environment with
trim_blocks and lstrip_blocks, the loop-control extension, a `{% generation %}` block that
renders its body, a `tojson` filter that keeps non-ASCII text and takes indent/separators/
sort_keys, and the globals `raise_exception`, `strftime_now`, `dict` and `namespace`.
The special tokens' texts are passed as `bos_token`, `eos_token`, `unk_token`, `pad_token`.

A template comes from the model file, so it is untrusted and rendering is bounded (`Limits`):
the source must be a string of at most `max_source` characters with no include/import/extends
(there is nothing to load them from); rendering stops with a ChatTemplateError after
`max_seconds` (a trace function checks the clock in the template's own frames and at every
Python call), when the output or any filter's or operator's result passes `max_chars`
(repetition and powers are checked before they run), on too deep recursion, or on any Python
error the template raises. The CLI and the API render through this one class.

Must not tokenize or touch a model: messages and token texts in, one string out.
"""
from __future__ import annotations

import functools
import json
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, Callable, Sequence

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
    if indent is not None and not (isinstance(indent, int) and 0 <= indent <= MAX_INDENT):
        raise jinja2.exceptions.SecurityError(f"tojson indent: expected 0 to {MAX_INDENT}, found {indent!r:.40}")
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
        if _too_big(value, Limits.max_chars):
            raise jinja2.exceptions.SecurityError(f"namespace value of {len(value)} items is too long")
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates may not set underscore attributes ({name!r})")


def _dict(*args, **kwargs) -> dict:
    return dict(*args, **kwargs)


@dataclass(frozen=True)
class Limits:
    """Bounds on one template: its source length, and each render's output and time."""

    max_source: int = 1 << 20  # characters of template source
    max_chars: int = 4 << 20  # characters of output, and of any intermediate string or list
    max_seconds: float = 5.0  # wall time of one render


MAX_INDENT = 64  # tojson's indent at most (a huge indent is a huge string)
_RENDER_FILE = "<template>"  # the file name jinja2 compiles templates under


def _too_big(value: Any, limit: int) -> bool:
    return isinstance(value, (str, bytes, list, tuple, dict)) and len(value) > limit


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox with size checks on repetition, powers and every filter's result."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    max_chars = Limits.max_chars

    def call_binop(self, context, op: str, left: Any, right: Any) -> Any:
        sized = (str, bytes, list, tuple)
        if op == "*" and isinstance(left, int) and isinstance(right, sized):
            left, right = right, left
        if op == "*" and isinstance(left, sized) and isinstance(right, int) and len(left) * right > self.max_chars:
            raise jinja2.exceptions.SecurityError(f"repetition of {len(left)} items x {right} is too long")
        if op == "**" and isinstance(right, (int, float)) and abs(right) > 1024 and not isinstance(left, bool) \
                and isinstance(left, (int, float)) and abs(left) > 1:
            raise jinja2.exceptions.SecurityError(f"power with exponent {right!r:.40} is too large")
        out = self.binop_table[op](left, right)
        if _too_big(out, self.max_chars):
            raise jinja2.exceptions.SecurityError(f"a {op!r} result of {len(out)} items is too long")
        return out

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
        out = ImmutableSandboxedEnvironment.call(__self, __context, __obj, *args, **kwargs)
        if _too_big(out, __self.max_chars):
            raise jinja2.exceptions.SecurityError(f"a call's result of {len(out)} items is too long")
        return out


def _bounded_filter(name: str, f: Callable, max_chars: int) -> Callable:
    @functools.wraps(f)  # keeps jinja2's pass_context/... marks
    def bounded(*args, **kwargs):
        for a in (*args, *kwargs.values()):
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > max_chars:
                raise jinja2.exceptions.SecurityError(f"filter {name}: argument {a} is too large")
        out = f(*args, **kwargs)
        if _too_big(out, max_chars):
            raise jinja2.exceptions.SecurityError(f"filter {name}: result of {len(out)} items is too long")
        return out
    return bounded


@lru_cache(maxsize=8)
def _compile(source: str, max_chars: int) -> jinja2.Template:
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                              extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.max_chars = max_chars
    env.filters["tojson"] = _tojson
    env.filters = {name: _bounded_filter(name, f, max_chars) for name, f in env.filters.items()}
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_dict,
                       namespace=_Namespace)
    refused = next(iter(env.parse(source).find_all((jinja2.nodes.Include, jinja2.nodes.Import,
                                                    jinja2.nodes.FromImport, jinja2.nodes.Extends))), None)
    if refused is not None:
        raise ChatTemplateError(f"chat template: line {refused.lineno}: {type(refused).__name__.lower()} is not "
                                "allowed (a template stands alone)")
    return env.from_string(source)


class _Deadline:
    """A trace function that raises once `seconds` have passed: checked at every Python call and
    on every line of the template's own code (its loops)."""

    def __init__(self, seconds: float):
        self.seconds, self.end = seconds, time.monotonic() + seconds

    def _check(self) -> None:
        if time.monotonic() > self.end:
            raise ChatTemplateError(f"chat template: rendering took longer than {self.seconds:g} s")

    def __call__(self, frame, event: str, arg: Any):
        self._check()
        return self._line if frame.f_code.co_filename == _RENDER_FILE else None

    def _line(self, frame, event: str, arg: Any):
        self._check()
        return self._line


class ChatTemplate:
    """A model's chat template with its special tokens' texts, rendered within `limits`."""

    def __init__(self, source: Any, special_tokens: dict[str, str | None], limits: Limits = Limits(),
                 key: str = "tokenizer.chat_template"):
        self.limits = limits
        if not isinstance(source, str):
            raise ChatTemplateError(f"metadata key {key!r}: expected a string (a jinja2 template), "
                                    f"found {type(source).__name__}")
        try:
            source.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ChatTemplateError(f"metadata key {key!r}: not valid UTF-8 (at character {e.start})") from None
        if len(source) > limits.max_source:
            raise ChatTemplateError(f"metadata key {key!r}: expected at most {limits.max_source} characters, "
                                    f"found {len(source)}")
        self.source = source
        self.special_tokens = {k: v for k, v in special_tokens.items() if isinstance(v, str)}
        try:
            self._template = _compile(source, limits.max_chars)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template: syntax error on line {e.lineno}: {e.message}") from None
        except (RecursionError, MemoryError):
            raise ChatTemplateError("chat template: nested too deeply to compile") from None

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict] | None = None, documents: list[dict] | None = None, **kwargs: Any) -> str:
        """The prompt text of `messages` (dicts with 'role' and 'content'), ending with the
        assistant's turn opening when `add_generation_prompt`."""
        for m in messages:
            if not isinstance(m, dict):
                raise ChatTemplateError(f"chat messages must be dicts with 'role' and 'content', found {m!r:.80}")
        context = dict(messages=[dict(m) for m in messages], tools=tools, documents=documents,
                       add_generation_prompt=add_generation_prompt, **{**self.special_tokens, **kwargs})
        previous = sys.gettrace()
        sys.settrace(_Deadline(self.limits.max_seconds))
        try:
            return self._collect(self._template.generate(**context))
        except ChatTemplateError:
            raise
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"chat template: {e}") from None
        except RecursionError:
            raise ChatTemplateError("chat template: recursion too deep") from None
        except MemoryError:
            raise ChatTemplateError("chat template: out of memory while rendering") from None
        except Exception as e:  # a Python error inside the template (1/0, a bad operand, ...)
            raise ChatTemplateError(f"chat template: {type(e).__name__}: {str(e)[:200]}") from None
        finally:
            sys.settrace(previous)

    def _collect(self, pieces) -> str:
        out, n = [], 0
        for piece in pieces:
            n += len(piece)
            if n > self.limits.max_chars:
                raise ChatTemplateError(f"chat template: output longer than {self.limits.max_chars} characters")
            out.append(piece)
        return "".join(out)


__all__ = ["ChatTemplate", "ChatTemplateError", "Limits"]
