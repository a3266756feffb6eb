"""The browser page's routes in this process: the pages and their files at / (none with
webui off), nothing loaded from another origin, and GET /api/memory against the model's own
counters and page table on the tiny model with half its experts in RAM."""
from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from strata.server import ServerConfig, create_app
from strata.server.web import ASSETS, asset




def _ready(client: TestClient, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while client.get("/health").status_code != 200:
        assert time.monotonic() < deadline, "the model did not load"
        time.sleep(0.02)


def _half_in_ram(tiny_path):
    """A loader of the tiny model with 2 of its 4 experts per layer in RAM (the paged memory)."""
    import strata
    from strata.gguf import open_model
    from strata.memory.budget import host_budget_for_slots

    with open_model(tiny_path) as mf:
        budget = host_budget_for_slots(mf, 2)
    loaded = []

    def loader():
        loaded.append(strata.load(tiny_path, threads=1, max_batch=2, memory="paged", host_mem=budget))
        return loaded[0]

    return loader, loaded


@pytest.fixture(scope="module")
def web(tiny_path):
    loader, loaded = _half_in_ram(tiny_path)
    with TestClient(create_app(loader, ServerConfig("tiny", max_running=2))) as client:
        _ready(client)
        yield client, loaded[0]


def test_pages_and_their_files(web):
    client, _ = web
    for path, name in (("/", "index.html"), ("/memory", "memory.html")):
        page = client.get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert page.content == asset(name)
        assert page.text.startswith("<!doctype html>") and f'<a href="{path}" class="current">' in page.text  # whole
        assert page.headers["content-security-policy"].startswith("default-src 'self'")
        for src in re.findall(r'(?:src|href)="(/web/[^"]+)"', page.text):  # every script and style it names
            got = client.get(src)
            assert got.status_code == 200 and got.content == asset(src.rsplit("/", 1)[1]), src
    assert client.get("/web/chat.js").headers["content-type"].startswith("text/javascript")
    missing = client.get("/web/secret.py")
    assert missing.status_code == 404 and "no such file" in missing.json()["error"]["message"]
    assert client.get("/web/..%2Fapp.py").status_code == 404


def test_nothing_comes_from_another_origin():
    for name in ASSETS:
        text = asset(name).decode()
        assert not re.search(r"(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text), f"{name} names another origin"
        assert "<script>" not in text and " on" + "click=" not in text  # the policy forbids inline scripts


def test_memory_json_matches_the_memory(web):
    client, model = web
    done = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hello there"}],
                                                     "max_tokens": 6, "temperature": 0})
    assert done.status_code == 200
    report = client.get("/api/memory").json()
    stats, table = model.memory_stats(), model.memory.page_table
    E, L = model.hparams.n_experts, len(stats.layers)
    assert report["model"] == "tiny" and report["n_experts"] == E == 4 and report["fast_tier"] == "RAM"
    assert report["tiers"] == ["device", "disk"] and len(report["layers"]) == L == 2
    tokens = int(stats.routing_tokens.max())
    assert tokens == done.json()["usage"]["total_tokens"] - 1  # every token but the last sampled went through
    assert report["total"]["tokens"] == tokens and report["total"]["requests"] == stats.total("requests")
    assert report["total"]["disk_bytes_per_token"] == pytest.approx(stats.total("bytes_disk") / tokens)
    for i, row in enumerate(report["layers"]):
        assert row["layer"] == stats.layers[i] and row["tokens"] == tokens
        assert row["tier"] == [0 if slot >= 0 else 1 for slot in table[i]]  # the page table, as tiers
        assert row["tier_counts"] == {"device": 2, "disk": 2}
        assert row["routing"] == stats.routing_counts[i].tolist() and sum(row["routing"]) == tokens * 2  # top-2
        assert row["requests"] == stats.requests[i] > 0 and row["disk_reads"] == stats.disk_reads[i] > 0
        assert row["device_hit_rate"] == pytest.approx(stats.device_hits[i] / stats.requests[i])
        assert row["disk_bytes_per_token"] == pytest.approx(stats.bytes_disk[i] / tokens)
        assert row["host_hit_rate"] == 0.0 and row["precision"] is None  # one pool, no prefetch


def test_memory_json_of_the_tiered_memory(tiny_path):
    import strata

    model = strata.load(tiny_path, threads=1, max_batch=1, memory="tiered", compute="float")
    with TestClient(create_app(lambda: model, ServerConfig("tiny"))) as client:
        _ready(client)
        assert client.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 3}).status_code == 200
        report = client.get("/api/memory").json()
        assert report["tiers"] == ["device", "host", "disk"]
        device, host = model.memory.policy.page_table, model.memory.host.policy.page_table
        for i, row in enumerate(report["layers"]):
            expected = np.where(device[i] >= 0, 0, np.where(host[i] >= 0, 1, 2))
            assert row["tier"] == expected.tolist() and sum(row["tier_counts"].values()) == 4
            assert row["tier_counts"]["device"] == int((device[i] >= 0).sum()) > 0


def test_webui_off_leaves_the_pages_out(tiny_path):
    import strata

    loading = threading.Event()

    def load():
        assert loading.wait(60), "the test did not let the model load"
        return strata.load(tiny_path, threads=1, max_batch=1, memory="paged")

    app = create_app(load, ServerConfig("tiny", webui=False))
    with TestClient(app) as client:
        assert client.get("/api/memory").status_code == 503  # still there, the model is loading
        loading.set()
        _ready(client)
        for path in ("/", "/memory", "/web/chat.js"):
            assert client.get(path).status_code == 404, path
        report = client.get("/api/memory").json()  # every expert in RAM
        assert report["tiers"] == ["device", "disk"] and len(report["layers"]) == 2


def test_serve_no_webui(request, tmp_path_factory, tiny_path):
    import httpx

    from .conftest import start

    server = start(request, tmp_path_factory, tiny_path, "--no-webui")
    assert httpx.get(server.url + "/", timeout=10).status_code == 404
    assert httpx.get(server.url + "/api/memory", timeout=10).status_code == 200
