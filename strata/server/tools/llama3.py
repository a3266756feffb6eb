"""Llama 3.1 / 3.2 / 3.3 / 4: a reply that is a JSON object `{"name": NAME, "parameters": {...}}`
(optionally after `<|python_tag|>`; several separated by `;`). A stream holds such a reply until
it ends: it is a call only if the whole reply reads as calls, else it is content."""
from __future__ import annotations

import json

from .base import Call, Parsed, Parser

TAG = "<|python_tag|>"


class Llama3Parser(Parser):
    name = "llama3"
    markup = (TAG,)

    def parse(self, text: str, final: bool = True) -> Parsed:
        body = text.strip().removeprefix(TAG).strip()
        looks = text.lstrip().startswith(("{", TAG)) or TAG.startswith(text.lstrip())
        if not final:
            return Parsed("" if looks else text)
        calls = _calls(body) if looks else None
        return Parsed(text) if calls is None else Parsed("", calls)


def _calls(body: str) -> list[Call] | None:
    calls, decoder, pos = [], json.JSONDecoder(), 0
    while pos < len(body):
        try:
            obj, pos = decoder.raw_decode(body, pos)
        except json.JSONDecodeError:
            return None
        args = obj.get("parameters", obj.get("arguments")) if isinstance(obj, dict) else None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(args, (dict, str)):
            return None
        calls.append(Call(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False), True))
        while pos < len(body) and body[pos] in " \t\n;":
            pos += 1
    return calls or None
