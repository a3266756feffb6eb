"""Hermes / Qwen2.5 / Qwen3: `<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>`, one
block per call (NousResearch's Hermes format, which Qwen's templates ask for)."""
from __future__ import annotations

import re

from .base import Call, TagBlockParser, json_end

_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')


class HermesParser(TagBlockParser):
    name = "hermes"

    def call(self, body: str, done: bool) -> Call | None:
        name = _NAME.search(body)
        if name is None:
            return None
        args = _ARGS.search(body)
        if args is None:
            return Call(_unescape(name.group(1)), "{}" if done else "")
        end = json_end(body, args.end())
        raw = body[args.end():end] if end is not None else body[args.end():].rstrip()
        return Call(_unescape(name.group(1)), raw.strip())


def _unescape(name: str) -> str:
    return name.encode().decode("unicode_escape") if "\\" in name else name
