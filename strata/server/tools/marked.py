"""Families whose calls sit between special tokens, the arguments raw JSON after a separator:

- DeepSeek-V3 / V3.1 / R1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{args}<｜tool▁call▁end｜>
  ...<｜tool▁calls▁end｜>` (V3 and R1 write `function<｜tool▁sep｜>NAME` and the arguments in a
  ```json fence);
- Kimi-K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:INDEX
  <|tool_call_argument_begin|>{args}<|tool_call_end|>...<|tool_calls_section_end|>`;
- Mistral (v11+ tokenizers, Devstral, Mistral-Small-3.2): `[TOOL_CALLS]NAME[ARGS]{args}` per call;
  the older `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` list is read too.
"""
from __future__ import annotations

import json
import re

from .base import Call, Parsed, Parser, held, json_end


class MarkedParser(Parser):
    """A family's markers: `section` (may be empty) and `section_end` around the calls, each call
    `open` NAME `sep` ARGUMENTS `close`; the markers that start a tool-call part (`starts`) and
    all the markup follow from them."""
    section = open = sep = section_end = ""
    close: str | None = None  # None: the arguments end where their JSON value ends

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.starts = tuple(m for m in (cls.section, cls.open) if m)
        cls.markup = (*cls.starts, *(m for m in (cls.sep, cls.close, cls.section_end) if m))

    def parse(self, text: str, final: bool = True) -> Parsed:
        content, rest = self.split_content(text, final)
        out = Parsed(content)
        if rest is not None:
            out.open_at = len(content)  # the section is open until its first call closes
        pos = 0
        while rest is not None:
            i = rest.find(self.open, pos)
            if i < 0:
                break
            if out.calls:  # a later call begun: open until it closes
                out.open_at = len(content) + i
            j = rest.find(self.sep, i + len(self.open))
            if j < 0:
                break
            call, pos = self._call(rest, rest[i + len(self.open):j], j + len(self.sep), final)
            out.calls.append(call)
            if not call.done:
                break
            out.open_at = None
        return out

    def _call(self, rest: str, head: str, start: int, final: bool) -> tuple[Call, int]:
        name, start = self.call_name(head, rest, start)
        if name is None:  # a stream has not reached the whole name
            return Call(None), len(rest)
        if self.close is not None:
            end = rest.find(self.close, start)
            if end >= 0:
                return Call(name, self.arguments(rest[start:end], True), True), end + len(self.close)
            tail = rest[start:] if final else held(rest[start:], self.close)
            return Call(name, self.arguments(tail, final)), len(rest)
        end = json_end(rest, start)
        if end is None:
            tail = rest[start:]
            return Call(name, tail.strip() if final else tail.lstrip().rstrip()), len(rest)
        return Call(name, rest[start:end].strip(), True), end

    def call_name(self, head: str, rest: str, start: int) -> tuple[str | None, int]:
        return head.strip(), start

    def arguments(self, raw: str, done: bool) -> str:
        return raw.strip() if done else raw.lstrip().rstrip()


class DeepSeekParser(MarkedParser):
    name = "deepseek"
    section, section_end = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    open, sep, close = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"

    def call_name(self, head: str, rest: str, start: int) -> tuple[str, int]:
        if head.strip() != "function":
            return head.strip(), start
        line = rest.find("\n", start)  # V3 / R1: function<｜tool▁sep｜>NAME\n```json\n{...}\n```
        return (rest[start:line].strip(), line + 1) if line >= 0 else (None, len(rest))

    def arguments(self, raw: str, done: bool) -> str:
        text = raw.strip() if done else raw.lstrip()
        if not done and text.startswith("`") and "\n" not in text:
            return ""  # the fence's first line is not whole yet
        if text.startswith("```"):
            text = text[3:].removeprefix("json").lstrip()
            text = text.rstrip().removesuffix("```").rstrip() if done else held(text, "\n```").rstrip("`").rstrip()
        return text if done else text.rstrip()


class KimiParser(MarkedParser):
    name = "kimi"
    section, section_end = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
    open, sep, close = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"

    def call_name(self, head: str, rest: str, start: int) -> tuple[str, int]:
        name = head.strip().removeprefix("functions.")  # functions.NAME:INDEX
        return re.sub(r":\d+$", "", name), start


class MistralParser(MarkedParser):
    name = "mistral"
    open, sep, close = "[TOOL_CALLS]", "[ARGS]", None

    def parse(self, text: str, final: bool = True) -> Parsed:
        content, rest = self.split_content(text, final)
        if rest is not None and rest[len(self.open):].lstrip().startswith("["):  # the older JSON list
            calls = _json_list(rest[len(self.open):])
            return Parsed(content, calls or [], open_at=len(content) if calls is None else None)
        return super().parse(text, final)


def _json_list(text: str) -> list[Call] | None:
    """The calls of a whole JSON list (None while it is not whole: a stream reads it whole)."""
    end = json_end(text, 0)
    if end is None:
        return None
    try:
        items = json.loads(text[:end])
    except json.JSONDecodeError:
        return []
    return [Call(c["name"], json.dumps(c.get("arguments", c.get("parameters", {})), ensure_ascii=False), True)
            for c in items if isinstance(c, dict) and isinstance(c.get("name"), str)]
