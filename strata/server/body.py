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

from .errors import APIError, bad_request

MAX_DEPTH = 64  # OpenAI's structured outputs allow 10 levels of schema; tool schemas rarely pass 20
MAX_INT_DIGITS = 20  # 2**64 - 1 has 20 digits: the largest integer any field (seed) takes
_SURROGATE = re.compile("[\ud800-\udfff]")


class _Refused(ValueError):
    """Raised from json's hooks; carries the message to answer with."""


def decode(body: bytes) -> Any:
    """The body's JSON value; APIError 400 naming the fault (and the field, where one is at fault)."""
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise bad_request(f"the request body is not valid UTF-8: byte 0x{body[e.start]:02x} at offset {e.start}") from None
    try:
        value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except _Refused as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise _too_deep(None) from None
    except ValueError as e:  # JSONDecodeError, or a number Python will not convert
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    _check_tree(value)
    return value


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {digits} digits ({text[:12]}...); at most {MAX_INT_DIGITS} are accepted")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:24]} is out of range for a double")
    return value


def _parse_constant(name: str) -> float:
    raise _Refused(f"{name} is not a JSON value")


def _check_tree(value: Any) -> None:
    """Depth and strings, walked with a stack (no recursion); a container's path is built only
    for containers, so a long list of token ids costs one type check per id."""
    stack: list[tuple[Any, tuple, int]] = [(value, (), 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _too_deep(path)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(key, str) and _SURROGATE.search(key):
                raise _surrogate(path, key, "a key")
            if isinstance(child, str):
                if _SURROGATE.search(child):
                    raise _surrogate(path + (key,), child, "a string")
            elif isinstance(child, (dict, list)):
                stack.append((child, path + (key,), depth + 1))


def _name(path: tuple) -> str | None:
    """('messages', 0, 'content') -> 'messages[0].content'; None for the body itself."""
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out or None


def _too_deep(path: tuple | None) -> APIError:
    """Named by the top-level field only: the full path of a deep node is as long as the nesting."""
    field = path[0] if path and isinstance(path[0], str) else None
    where = f" in {field}" if field else ""
    return bad_request(f"the request body nests arrays and objects more than {MAX_DEPTH} levels deep{where}",
                       param=field)


def _surrogate(path: tuple, text: str, what: str) -> APIError:
    char = _SURROGATE.search(text).group()
    return bad_request(f"{what} in the request body holds a lone UTF-16 surrogate \\u{ord(char):04x}, which is not "
                       "a character", param=_name(path))


__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "decode"]
