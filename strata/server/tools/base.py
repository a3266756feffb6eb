"""What every tool-call family parser shares: the parsed shape and the text helpers.

A parser reads the assistant's generated text (the reasoning already split off) and returns
`Parsed`: the plain content and the calls, each with its name and its arguments as the raw
JSON text the model wrote. With `final=False` the text is a stream's prefix: what a parser
returns must only grow as more text arrives (a marker's first characters are held back until
they are known not to start a marker), so a stream can send the difference as deltas. A call is
`done` once its syntax is closed (its end marker, or its JSON whole where there is none), final
or not; where the text ends inside a call, `Parsed.open_at` says where that call's markup began,
so a reply cut by its token limit can leave the unfinished call out.

Must not know HTTP or the engine: text in, `Parsed` out.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class Call:
    name: str | None  # None while a stream has not reached the whole name
    arguments: str = ""  # the raw JSON text of the arguments so far
    done: bool = False  # its syntax is closed: the arguments are all there


@dataclass
class Parsed:
    content: str = ""
    calls: list[Call] = field(default_factory=list)
    reasoning: str = ""  # only families whose syntax carries reasoning (harmony's analysis channel)
    open_at: int | None = None  # where the text's unclosed call begins (its name written or not); None: none is


def held(text: str, *markers: str) -> str:
    """`text` less its longest end that could be the start of one of `markers`."""
    cut = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), cut, -1):
            if text.endswith(m[:n]):
                cut = n
                break
    return text[:len(text) - cut] if cut else text


def json_end(text: str, start: int) -> int | None:
    """The index just past the JSON value at `text[start:]` (leading spaces skipped); None when
    it is not a whole JSON value."""
    while start < len(text) and text[start].isspace():
        start += 1
    try:
        _, end = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError:
        return None
    return end


def partial_arguments(text: str) -> str:
    """A stream's unfinished arguments text, without trailing spaces (they may end the value)."""
    return text.rstrip()


def value_json(value: str) -> object:
    """A parameter written as text (GLM, Qwen3-Coder): its JSON value when it is one, else the string."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


class Parser:
    """One family's syntax. Subclasses set `name` and implement `parse`."""

    name = ""
    starts: tuple[str, ...] = ()  # markers that open the tool-call part of a reply
    #: Every marker the parser reads: a chat's text keeps the control tokens spelling one of them
    #: and leaves out the others, as llama-server keeps a format's "preserved tokens".
    markup: tuple[str, ...] = ()

    def parse(self, text: str, final: bool = True) -> Parsed:
        raise NotImplementedError

    def split_content(self, text: str, final: bool) -> tuple[str, str | None]:
        """(the content before the first start marker, the rest from the marker on or None)."""
        hits = [i for i in (text.find(m) for m in self.starts) if i >= 0]
        if not hits:
            return (text if final else held(text, *self.starts)), None
        i = min(hits)
        return text[:i], text[i:]


class TagBlockParser(Parser):
    """Families whose calls are `<tool_call>BODY</tool_call>` blocks, one a call, in a row after the
    content (Hermes, GLM, Qwen3-Coder); subclasses read one block's body in `call`."""

    open, close = "<tool_call>", "</tool_call>"
    starts = markup = (open, close)

    def parse(self, text: str, final: bool = True) -> Parsed:
        content, rest = self.split_content(text, final)
        out = Parsed(content)
        at = len(content)  # where `rest` begins in `text`
        while rest is not None and rest.lstrip().startswith(self.open):
            start = rest.index(self.open) + len(self.open)
            end = rest.find(self.close, start)
            body = rest[start:end] if end >= 0 else rest[start:] if final else held(rest[start:], self.close)
            call = self.call(body, end >= 0 or final)
            if call is not None:
                call.done = end >= 0
                out.calls.append(call)
            if end < 0:
                out.open_at = at
                return out
            at += end + len(self.close)
            rest = rest[end + len(self.close):]
        tail = (rest if final else held(rest, self.open)) if rest else ""
        if tail.strip():
            out.content += tail
        return out

    def call(self, body: str, done: bool) -> Call | None:
        """One block's call (None while a stream has not reached its name); `done`: the block is whole,
        or the reply ended inside it (its `done` is then set from whether the block was closed)."""
        raise NotImplementedError


__all__ = ["Call", "Parsed", "Parser", "TagBlockParser", "held", "json_end", "partial_arguments", "value_json"]
