"""Malformed request bodies against the real app (the tiny model loaded in this process): every
one is an OpenAI-shaped 400 with a message that says what was wrong, never a 500, and the next
good request still succeeds. Structured cases (deep nesting, huge numbers, NaN, bad UTF-8, lone
surrogates, non-object bodies) and seeded random mutants of good bodies."""
from __future__ import annotations

import json
import random
import time

import pytest
from fastapi.testclient import TestClient

from strata.server import ServerConfig, create_app
from strata.server.body import MAX_DEPTH, MAX_INT_DIGITS, decode

PATHS = ("/v1/completions", "/v1/chat/completions")
GOOD = {"/v1/completions": {"prompt": "hello there", "max_tokens": 2, "temperature": 0, "ignore_eos": True,
                            "stop": ["x"]},
        "/v1/chat/completions": {"messages": [{"role": "system", "content": "be brief"},
                                              {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                                 "max_tokens": 2, "temperature": 0.5, "seed": 7}}


@pytest.fixture(scope="module")
def http(tiny_path):
    import strata

    app = create_app(lambda: strata.load(tiny_path, threads=1, n_ctx=128, max_batch=1), ServerConfig("tiny"))
    with TestClient(app, raise_server_exceptions=False) as client:
        deadline = time.monotonic() + 120
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the tiny model did not load"
            time.sleep(0.02)
        yield client


def post(http, path: str, body: bytes):
    return http.post(path, content=body, headers={"Content-Type": "application/json"})


def refused(response, param: str | None = None) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    return error["message"]


def nest(depth: int, open_: str = "[", close: str = "]", inner: str = "1") -> str:
    return open_ * depth + inner + close * depth


CASES = [  # (name, body, param, words in the message)
    ("100,000 nested arrays", nest(100_000), None, f"more than {MAX_DEPTH} levels"),
    ("100,000 nested objects", nest(100_000, '{"a":', "}"), None, f"more than {MAX_DEPTH} levels"),
    ("deep stop", '{"prompt": "x", "stop": %s}' % nest(5000, inner='"a"'), None, "levels deep"),
    ("deep tools", '{"messages": [], "tools": %s}' % nest(MAX_DEPTH + 1), "tools", "levels deep (at tools)"),
    ("deep content", '{"messages": [{"role": "user", "content": %s}]}' % nest(300, '{"t":', "}"), "messages",
     "levels deep (at messages)"),
    ("5,000-digit integer", '{"prompt": "x", "max_tokens": %s}' % ("9" * 5000), None, "5000 digits"),
    ("negative 30-digit seed", '{"prompt": "x", "seed": -%s}' % ("1" * 30), None, "30 digits"),
    ("huge token id", '{"prompt": [1, %s]}' % ("7" * 400), None, "400 digits"),
    ("1e999", '{"prompt": "x", "temperature": 1e999}', None, "out of range"),
    ("-1e400", '{"prompt": "x", "top_p": -1e400}', None, "out of range"),
    ("NaN", '{"prompt": "x", "temperature": NaN}', None, "has NaN, which is not JSON"),
    ("-Infinity", '{"prompt": "x", "max_tokens": -Infinity}', None, "-Infinity"),
    ("lone high surrogate", '{"prompt": "a\\ud800b"}', "prompt", "surrogate \\ud800"),
    ("lone low surrogate in chat", '{"messages": [{"role": "user", "content": "\\udfff"}]}',
     "messages[0].content", "surrogate \\udfff"),
    ("surrogate key", '{"prompt": "x", "\\udc00": 1}', None, "\\udc00 in a key"),
    ("empty", "", None, "not valid JSON"),
    ("truncated", '{"prompt": "x", "max_tok', None, "not valid JSON"),
    ("trailing data", '{"prompt": "x"} []', None, "Extra data"),
    ("single quotes", "{'prompt': 'x'}", None, "not valid JSON"),
    ("null", "null", None, "JSON object"),
    ("array", '[{"prompt": "x"}]', None, "JSON object"),
    ("string", '"prompt"', None, "JSON object"),
    ("number", "42", None, "JSON object"),
]


@pytest.mark.parametrize("name, body, param, words", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("path", PATHS)
def test_malformed_body_is_a_400(http, path, name, body, param, words):
    message = refused(post(http, path, body.encode()), param)
    assert words in message and len(message) < 300, message


@pytest.mark.parametrize("raw, words", [
    (b'{"prompt": "\xff"}', "byte 0xff at offset 12"),
    (b'{"prompt": "\xc3"}', "byte 0xc3 at offset 12"),  # a truncated two-byte sequence
    (b'{"prompt": "\xed\xa0\x80"}', "byte 0xed"),  # a surrogate encoded in UTF-8 (CESU)
    ('{"prompt": "x"}'.encode("utf-16"), "not valid UTF-8"),
])
def test_invalid_utf8_is_a_400(http, raw, words):
    for path in PATHS:
        assert words in refused(post(http, path, raw))


def test_limits_are_inclusive(http):
    assert decode(nest(MAX_DEPTH).encode()) is not None
    assert decode(b'{"seed": %d}' % (2**64 - 1))["seed"] == 2**64 - 1 and len(str(2**64 - 1)) == MAX_INT_DIGITS
    assert decode(b"\xef\xbb\xbf" + json.dumps(GOOD[PATHS[0]]).encode()) == GOOD[PATHS[0]]  # a BOM is allowed
    assert decode('{"prompt": "caf\\u00e9 \\ud83d\\ude00"}'.encode())["prompt"] == "café \U0001F600"  # a pair is fine
    for path in PATHS:
        assert post(http, path, json.dumps(GOOD[path]).encode()).status_code == 200


def mutate(body: bytes, rng: random.Random) -> bytes:
    """One to three edits: a byte flipped, a hostile token inserted, a slice cut or repeated."""
    tokens = [b"[", b"{", b"]", b"}", b'"', b"\\", b",", b":", b"\\ud800", b"NaN", b"1e999", b"9" * 40, b"\xff",
              b"\xc3", b"null", b"[" * 2000, b'{"a":' * 2000, b"-", b"0.", b"\x00", b"true"]
    data = bytearray(body)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(data) + 1)
        kind = rng.randrange(4)
        if kind == 0 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif kind == 1:
            data[at:at] = rng.choice(tokens)
        elif kind == 2:
            del data[at:at + rng.randint(1, 8)]
        else:
            data[at:at] = data[at:at + rng.randint(1, 16)] * rng.randint(2, 50)
    return bytes(data)


def test_random_mutants_are_never_a_500(http):
    rng, statuses = random.Random(26), {}
    for i in range(240):
        path = PATHS[i % 2]
        body = mutate(json.dumps(GOOD[path]).encode(), rng)
        response = post(http, path, body)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code in (200, 400), (body[:200], response.text[:300])
        if response.status_code == 400:
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error" and 0 < len(error["message"]) < 600, (body[:200], error)
    assert statuses.get(400, 0) > 100 and statuses.get(200, 0) > 5, statuses  # both kinds were reached
    for path in PATHS:
        assert post(http, path, json.dumps(GOOD[path]).encode()).status_code == 200


@pytest.mark.parametrize("arguments, words", [
    (nest(100_000), f"nests arrays and objects more than {MAX_DEPTH} levels deep"),
    ('{"n": %s}' % ("9" * 5000), "5000 digits"),
    ('{"x": NaN}', "NaN"),
    ('{"city": "Par', "is not valid JSON"),
])
def test_malformed_tool_call_arguments_are_a_400(http, arguments, words):
    """The arguments of an assistant's earlier tool call are JSON inside a JSON string."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    body = {"messages": [{"role": "user", "content": "weather?"}, {"role": "assistant", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], "max_tokens": 2}
    message = refused(post(http, "/v1/chat/completions", json.dumps(body).encode()),
                      "messages[1].tool_calls[0].function.arguments")
    assert words in message and len(message) < 400, message
