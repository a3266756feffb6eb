"""Hermes / Qwen2.5 / Qwen3: `<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>`, one
block per call (NousResearch's Hermes format, which Qwen's templates ask for)."""
from __future__ import annotations

import re

from .base import Call, Parsed, Parser, held, json_end

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')


class HermesParser(Parser):
    name = "hermes"
    starts = (OPEN,)

    def parse(self, text: str, final: bool = True) -> Parsed:
        content, rest = self.split_content(text, final)
        out = Parsed(content)
        while rest is not None and rest.lstrip().startswith(OPEN):
            start = rest.index(OPEN) + len(OPEN)
            end = rest.find(CLOSE, start)
            if end < 0:
                body = rest[start:] if final else held(rest[start:], CLOSE)
                call = _call(body, final)
                if call is not None:
                    out.calls.append(call)
                return out
            call = _call(rest[start:end], True)
            if call is not None:
                out.calls.append(call)
            rest = rest[end + len(CLOSE):]
        tail = (rest if final else held(rest, OPEN)) if rest else ""
        if tail.strip():
            out.content += tail
        return out


def _call(body: str, done: bool) -> Call | None:
    name = _NAME.search(body)
    if name is None:
        return None
    args = _ARGS.search(body)
    if args is None:
        return Call(_unescape(name.group(1)), "{}" if done else "", done)
    end = json_end(body, args.end())
    raw = body[args.end():end] if end is not None else body[args.end():].rstrip()
    return Call(_unescape(name.group(1)), raw.strip(), done or end is not None)


def _unescape(name: str) -> str:
    return name.encode().decode("unicode_escape") if "\\" in name else name
