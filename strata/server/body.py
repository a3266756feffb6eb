"""A request body's bytes to a JSON value, or a 400 that says what was wrong with them.

Beyond `json.loads`: the body must be UTF-8 (a leading byte-order mark is allowed); numbers must
be finite and integers at most `MAX_INT_DIGITS` digits long (Python refuses beyond 4,300 digits
with a ValueError, and no field takes more than 64 bits); NaN and Infinity are not JSON; arrays
and objects nest at most `MAX_DEPTH` deep (deeper bodies hit Python's recursion limit in the
parser, the template renderer or a schema compiler, far from the request); strings hold no lone
UTF-16 surrogates (`"\\ud800"` parses to a str that cannot be encoded for the tokenizer).

Must not know the endpoints' fields: `protocol` checks those.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from .errors import bad_request

MAX_DEPTH = 64  # OpenAI's structured outputs allow 10 levels of schema; tool schemas rarely pass 20
MAX_INT_DIGITS = 20  # 2**64 - 1 has 20 digits: the largest integer any field (seed) takes
_SURROGATE = re.compile("[\ud800-\udfff]")


class Refused(ValueError):
    """What breaks the limits or the grammar, worded to follow "the request body" (or a field's
    name); `path` leads to the field at fault inside the value, where one is known."""

    def __init__(self, message: str, path: tuple = ()):
        super().__init__(message)
        self.path = path


def decode(body: bytes) -> Any:
    """The body's JSON value; APIError 400 naming the fault (and the field, where one is at fault)."""
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise bad_request(f"the request body is not valid UTF-8: byte 0x{body[e.start]:02x} at offset {e.start}") from None
    try:
        return loads(text)
    except Refused as e:
        field = _name(e.path)
        raise bad_request(f"the request body {e}" + (f" (at {field})" if field else ""), param=field) from None


def loads(text: str) -> Any:
    """A JSON text under the limits above (a body, or a JSON string inside one); Refused if not."""
    try:
        value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except RecursionError:
        raise Refused(f"nests arrays and objects more than {MAX_DEPTH} levels deep") from None
    except Refused:
        raise
    except ValueError as e:  # JSONDecodeError, or a number Python will not convert
        raise Refused(f"is not valid JSON: {e}") from None
    _check_tree(value)
    return value


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise Refused(f"has an integer of {digits} digits ({text[:12]}...); at most {MAX_INT_DIGITS} are accepted")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Refused(f"has the number {text[:24]}, out of range for a double")
    return value


def _parse_constant(name: str) -> float:
    raise Refused(f"has {name}, which is not JSON")


def _check_tree(value: Any) -> None:
    """Depth and strings, walked with a stack (no recursion); a container's path is built only
    for containers, so a long list of token ids costs one type check per id."""
    stack: list[tuple[Any, tuple, int]] = [(value, (), 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:  # named by the top-level field: a deep node's path is as long as the nesting
            raise Refused(f"nests arrays and objects more than {MAX_DEPTH} levels deep", path[:1])
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(key, str) and _SURROGATE.search(key):
                raise _surrogate(key, "a key", path)
            if isinstance(child, str):
                if _SURROGATE.search(child):
                    raise _surrogate(child, "a string", path + (key,))
            elif isinstance(child, (dict, list)):
                stack.append((child, path + (key,), depth + 1))


def _surrogate(text: str, where: str, path: tuple) -> Refused:
    char = _SURROGATE.search(text).group()
    return Refused(f"has a lone UTF-16 surrogate \\u{ord(char):04x} in {where}, which is no character", path)


def _name(path: tuple) -> str | None:
    """('messages', 0, 'content') -> 'messages[0].content'; None for the value itself."""
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out or None


__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "Refused", "decode", "loads"]
