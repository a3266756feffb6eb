"""Families that write each argument as a key and a text value; the arguments JSON is built
from the pairs (a stream gets `{"k": v` as each pair closes, then `}`):

- GLM-4.5 / 4.6 / 4.7: `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>`;
- Qwen3-Coder: `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>...</function>\n</tool_call>`.

A value is JSON when it parses as JSON and the tool's schema does not call the parameter a string.
"""
from __future__ import annotations

import json
import re

from .base import Call, TagBlockParser, value_json

class PairsParser(TagBlockParser):
    pair: re.Pattern

    def __init__(self, tools: list[dict] | None = None):
        self.types = {t["function"]["name"]: {k: (v or {}).get("type") for k, v in
                                              ((t["function"].get("parameters") or {}).get("properties") or {}).items()}
                      for t in tools or () if isinstance(t.get("function"), dict)}

    def call(self, body: str, done: bool) -> Call | None:
        name = self.call_name(body, done)
        if not name:
            return None
        types = self.types.get(name, {})
        pairs = [f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(self._value(v, types.get(k)), ensure_ascii=False)}"
                 for k, v in self.pair.findall(body)]
        args = "{" + ", ".join(pairs)
        return Call(name, args + "}" if done else (args if pairs else ""))

    @staticmethod
    def _value(text: str, kind: str | None) -> object:
        return text if kind == "string" else value_json(text)

    def call_name(self, body: str, done: bool) -> str | None:
        raise NotImplementedError


class GLMParser(PairsParser):
    name = "glm"
    markup = (*TagBlockParser.markup, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
    pair = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)

    def call_name(self, body: str, done: bool) -> str | None:
        line = re.match(r"\s*([^\n<]*?)\s*(?:\n|<arg_key>|$)", body)
        whole = "\n" in body or "<arg_key>" in body or done
        return line.group(1) if line and whole else None


class QwenCoderParser(PairsParser):
    name = "qwen3-coder"
    markup = (*TagBlockParser.markup, "</function>", "</parameter>")
    pair = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)

    def call_name(self, body: str, done: bool) -> str | None:
        m = re.search(r"<function=([^>\n]+)>", body)
        return m.group(1).strip() if m else None
