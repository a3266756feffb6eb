"""A reply's text turned into OpenAI's shape as it grows: reasoning, content and tool calls.

`OutputStream.push(text)` takes the next piece of a stream and returns the deltas to send
(`{"reasoning_content": ...}`, `{"content": ...}`, `{"tool_calls": [{index, id, type, function:
{name, arguments}}]}`); `finish()` the last ones; `message()` the whole reply's parts. Every
delta is the difference of two parses of the text so far, so a stream's pieces add up to the
whole reply's parts.

A stream sends a tool call whole, once its syntax is closed, never a part of one: a reply may yet
be cut by its token limit (`cut`: finish_reason "length") inside a call, and a client must not
have been given half a call to act on. A cut reply keeps the calls closed before the cut; the
unfinished call is left out of `tool_calls` and its raw text goes back to the content, as
llama-server does (its parser reads a final text whose call is unfinished as content: tools
cleared, the text kept), and the reply's finish_reason says "length", as OpenAI's and
llama-server's do.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from ..reasoning import ThinkSplitter, opens_thinking
from . import detect, parser as family_parser
from .base import Parsed, Parser
from .harmony import HarmonyParser
from .request import ToolRequest


def call_id(family: str | None) -> str:
    # Mistral's templates refuse ids other than 9 letters and digits when the calls come back
    return uuid.uuid4().hex[:9] if family == "mistral" else f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class _Sent:
    id: str
    arguments: str = ""


@dataclass
class OutputStream:
    parser: Parser | None = None  # None: no tool calls are read
    think: ThinkSplitter | None = None  # None: reasoning stays inline
    parallel: bool = True  # False: only the first call counts
    text: str = ""
    _reasoning: str = ""
    _content: str = ""
    _calls: list[_Sent] = field(default_factory=list)

    def parse(self, final: bool = True, cut: bool = False) -> Parsed:
        """The text so far (`final`: all of it) read into its parts; the calls are those closed,
        and at the end of a reply not `cut` by its token limit the unclosed last one too (the
        model ended its reply there)."""
        reasoning, rest = self.think.split(self.text, final) if self.think is not None else ("", self.text)
        parsed = self.parser.parse(rest, final) if self.parser is not None else Parsed(rest)
        parsed.reasoning = reasoning + parsed.reasoning
        if cut or not final:
            parsed.calls = [c for c in parsed.calls if c.done]
        if cut and parsed.open_at is not None:
            parsed.content += rest[parsed.open_at:]
        if not self.parallel:
            parsed.calls = parsed.calls[:1]
        return parsed

    def push(self, text: str) -> list[dict[str, Any]]:
        self.text += text
        return self._deltas(self.parse(final=False))

    def finish(self, cut: bool = False) -> list[dict[str, Any]]:
        """The last deltas; `cut`: the reply ended at its token limit (finish_reason "length")."""
        return self._deltas(self.parse(final=True, cut=cut))

    def message(self, cut: bool = False) -> dict[str, Any]:
        """The whole reply: content (None beside calls when empty), reasoning_content, tool_calls;
        `cut` as in `finish`."""
        parsed = self.parse(final=True, cut=cut)
        self._deltas(parsed)  # gives the calls their ids
        out: dict[str, Any] = {"role": "assistant", "content": parsed.content or (None if parsed.calls else "")}
        if parsed.reasoning:
            out["reasoning_content"] = parsed.reasoning
        if parsed.calls:
            out["tool_calls"] = [{"id": s.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for s, c in zip(self._calls, parsed.calls)]
        return out

    @property
    def called(self) -> bool:
        return bool(self._calls)

    def _deltas(self, parsed: Parsed) -> list[dict[str, Any]]:
        out = []
        for key, new, attr in (("reasoning_content", parsed.reasoning, "_reasoning"),
                               ("content", parsed.content, "_content")):
            old = getattr(self, attr)
            if len(new) > len(old) and new.startswith(old):
                out.append({key: new[len(old):]})
                setattr(self, attr, new)
        calls = [d for i, c in enumerate(parsed.calls) if (d := self._call_delta(i, c)) is not None]
        if calls:
            out.append({"tool_calls": calls})
        return out

    def _call_delta(self, i: int, call) -> dict[str, Any] | None:
        if call.name is None or i > len(self._calls):
            return None
        if i == len(self._calls):
            self._calls.append(_Sent(call_id(self.parser.name if self.parser else None), call.arguments))
            return {"index": i, "id": self._calls[i].id, "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments}}
        sent = self._calls[i]
        if len(call.arguments) > len(sent.arguments) and call.arguments.startswith(sent.arguments):
            delta, sent.arguments = call.arguments[len(sent.arguments):], call.arguments
            return {"index": i, "function": {"arguments": delta}}
        return None


def output_stream(tools: ToolRequest, template_source: str | None, prompt: str, family: str | None = None,
                  reasoning_format: str = "auto") -> OutputStream:
    """How one chat reply is read: the tool-call family (`family`, else the template's), tool calls
    only when the request gave tools and did not say tool_choice none, reasoning split unless
    `reasoning_format` is "none"."""
    family = family or detect(template_source)
    split = reasoning_format != "none"
    if family == "harmony":  # its channels carry the reasoning whether or not tools were given
        return OutputStream(HarmonyParser(inline_reasoning=not split), None, tools.parallel)
    parser = family_parser(family, tools.tools) if tools.parse_calls else None
    think = ThinkSplitter(opens_thinking(prompt)) if split else None
    return OutputStream(parser, think, tools.parallel)


__all__ = ["OutputStream", "call_id", "output_stream"]
