"""What the pages read to tell the truth before anything happened: GET /health says whether a key
is wanted (the chat page brings its key box forward and words a 401 as a key to enter), and
GET /api/memory before the first request has each pool's slots, the experts really in them
(none yet) and no rates (None, not 0%), which the memory page words as "no tokens routed yet"."""
from __future__ import annotations

import time

from fastapi.testclient import TestClient

from strata.server import ServerConfig, create_app
from strata.server.web import asset


def _ready(client: TestClient, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while (health := client.get("/health")).status_code != 200:
        assert time.monotonic() < deadline, "the model did not load"
        time.sleep(0.02)
    return health.json()


def _half_in_ram(tiny_path):
    import strata
    from strata.gguf import open_model
    from strata.memory.budget import host_budget_for_slots

    with open_model(tiny_path) as mf:
        budget = host_budget_for_slots(mf, 2)
    return lambda: strata.load(tiny_path, threads=1, max_batch=1, memory="paged", host_mem=budget)


def test_health_says_whether_a_key_is_wanted(tiny_path):
    import strata

    model = strata.load(tiny_path, threads=1, max_batch=1)
    with TestClient(create_app(lambda: model, ServerConfig("tiny", api_key="sesame"))) as client:
        assert _ready(client) == {"status": "ok", "auth": True}  # open without the key
        assert client.get("/v1/models").status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Bearer sesame"}).status_code == 200


def test_memory_before_the_first_request_is_what_it_is(tiny_path):
    """The paged memory with room for 2 of the 4 experts per layer: before any request no expert
    is in RAM yet and there is no hit rate; after one, the slots are full and the rates are there."""
    with TestClient(create_app(_half_in_ram(tiny_path), ServerConfig("tiny"))) as client:
        _ready(client)
        before = client.get("/api/memory").json()
        assert before["slots"] == {"device": 2} and "2/4 per layer" in before["memory"]  # the same two numbers
        assert before["total"]["tokens"] == 0 and before["total"]["requests"] == 0
        assert before["total"]["device_hit_rate"] is None and before["total"]["host_hit_rate"] is None
        for row in before["layers"]:
            assert row["tier_counts"] == {"device": 0, "disk": 4}  # nothing read into a slot yet
            assert row["device_hit_rate"] is None and row["disk_bytes_per_token"] is None
        done = client.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 3, "temperature": 0})
        assert done.status_code == 200
        after = client.get("/api/memory").json()
        assert after["slots"] == {"device": 2} and after["total"]["tokens"] > 0
        assert 0 <= after["total"]["device_hit_rate"] <= 1
        for row in after["layers"]:
            assert row["tier_counts"] == {"device": 2, "disk": 2} and row["device_hit_rate"] is not None


def test_direct_memory_has_no_slots(tiny_path):
    import strata

    model = strata.load(tiny_path, threads=1, max_batch=1, memory="direct")
    with TestClient(create_app(lambda: model, ServerConfig("tiny"))) as client:
        _ready(client)
        report = client.get("/api/memory").json()
        assert report["slots"] is None and report["tiers"] is None


def test_the_pages_word_it():
    chat, page = asset("chat.js").decode(), asset("index.html").decode()
    assert '"This server needs an API key: enter it here"' in chat
    assert '"wrong or missing API key: enter it in the key box"' in chat
    assert "response.status === 401" in chat and "health.auth" in chat and 'fetch("/health")' in chat
    assert 'id="key-box"' in page and 'id="key-note"' in page
    memory = asset("memory.js").decode()
    assert '"no tokens routed yet"' in memory and "data.slots" in memory and "!t.tokens" in memory
    assert 'id="state"' in asset("memory.html").decode()
