"""The browser page of `strata serve`: a chat page at `/`, a live memory page at `/memory`, and
`GET /api/memory`, the JSON the memory page draws.

Plain HTML, JavaScript and CSS from `static/` (package data), no build step and nothing loaded
from elsewhere (a page is its own `<main>` in the shared skeleton `page.html`, put together as it
is served): every page goes out with a Content-Security-Policy that allows this origin only.
The chat page talks to the server's own `/v1/chat/completions` (server-sent events); the memory
page polls `/api/memory`, which serializes what the model's memory already exposes
(`Model.memory_stats()`: per-layer counters; `Model.expert_residency()`: which tier holds each
expert; the memory's `placement`: its slots per layer). Before the first request the pools hold
only what was placed at start-up (experts are read into slots as they are first routed) and there
is no hit rate yet: the JSON says so (rates None, not 0) and the page says "no tokens routed yet".
`--no-webui` (`ServerConfig.webui` False) leaves the pages out; `/api/memory` stays, as
`/metrics` does.

Must not compute statistics or touch the memory's internals: it reads the model's public API.
"""
from __future__ import annotations

import string
from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response

from ..errors import APIError

#: The page files, by URL name, with their media types: nothing else under static/ is served.
ASSETS = {"index.html": "text/html; charset=utf-8", "memory.html": "text/html; charset=utf-8",
          "style.css": "text/css; charset=utf-8", "common.js": "text/javascript; charset=utf-8",
          "chat.js": "text/javascript; charset=utf-8", "memory.js": "text/javascript; charset=utf-8"}
#: The pages, by file: (URL, nav label, title, script); their files hold only their <main>.
PAGES = {"index.html": ("/", "Chat", "Strata chat", "chat.js"),
         "memory.html": ("/memory", "Memory", "Strata expert memory", "memory.js")}
#: This origin only: no CDN, no external links, no inline scripts.
HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; base-uri 'none'; "
                                      "form-action 'none'; frame-ancestors 'none'",
           "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}


def asset(name: str) -> bytes:
    """The bytes of one page file as served, a page whole (KeyError for a name not in ASSETS)."""
    if name not in ASSETS:
        raise KeyError(name)
    return _page_html(name) if name in PAGES else _static(name)


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _page_html(name: str) -> bytes:
    """The skeleton (head, header and nav, scripts) around the page's <main>."""
    _, _, title, script = PAGES[name]
    nav = " ".join(f'<a href="{url}"' + (' class="current"' if page == name else "") + f">{label}</a>"
                   for page, (url, label, _, _) in PAGES.items())
    main = _static(name).decode("utf-8").rstrip("\n")
    skeleton = string.Template(_static("page.html").decode("utf-8"))
    return skeleton.substitute(title=title, nav=nav, main=main, script=script).encode("utf-8")


def _page(name: str) -> Response:
    return Response(asset(name), media_type=ASSETS[name], headers=HEADERS)


def add_routes(app: FastAPI, state: Any, webui: bool = True) -> None:
    """`GET /api/memory` always; the pages (`/`, `/memory`, `/web/FILE`) when `webui`."""

    @app.get("/api/memory")
    async def memory() -> dict[str, Any]:
        model, _ = state.ready()
        return memory_report(model, state.config.model_name)

    if not webui:
        return

    @app.get("/")
    async def chat_page() -> Response:
        return _page("index.html")

    @app.get("/memory")
    async def memory_page() -> Response:
        return _page("memory.html")

    @app.get("/web/{name}")
    async def web_file(name: str) -> Response:
        if name not in ASSETS:
            raise APIError(404, f"GET /web/{name}: no such file of the web page", code="not_found")
        return _page(name)


def _per_token(value: float, tokens: int) -> float | None:
    return value / tokens if tokens else None


def _rates(row: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The rates of a total or a layer's counters: None where nothing was asked yet (no hit rate
    is 0% before the first request)."""
    return {"device_hit_rate": row["device_hit_rate"] if row["requests"] else None,
            "host_hit_rate": row["host_hits"] / row["device_misses"] if row["device_misses"] else None,
            "disk_bytes_per_token": _per_token(row["bytes_disk"], tokens),
            "device_bytes_per_token": _per_token(row["bytes_to_device"], tokens)}


def _layer_row(row: dict[str, Any], tokens: int, routing: list[int], place: dict[str, Any] | None) -> dict[str, Any]:
    """One expert layer: its counters and rates (MemoryStats.per_layer), the tokens it routed,
    bytes per token into each tier, each expert's routing count and, with pools, its tier."""
    return {**row, "tokens": tokens, **_rates(row, tokens), "routing": routing,
            "tier": place["tier"] if place else None, "tier_counts": place["counts"] if place else None}


def _slots(model: Any, tiers: list[str] | None) -> dict[str, int] | None:
    """Each pool's slots per expert layer, by tier name (at most one per expert: the memory's
    `placement`), or None for a memory without pools."""
    placement = None if model.memory is None else model.memory.placement
    if placement is None or tiers is None:
        return None
    per_layer = {"device": placement.device_slots, "host": placement.host_slots}
    return {t: int(per_layer[t]) for t in tiers if t in per_layer}


def memory_report(model: Any, name: str) -> dict[str, Any]:
    """What the memory page draws, as plain JSON values: the model's memory counters in total
    and per expert layer, with where each expert sits now and each pool's slots per layer (None
    where the experts are read in place from the file: no tiers to show)."""
    hp, stats = model.hparams, model.memory_stats()
    device = str(model.device)
    report: dict[str, Any] = {"model": name, "device": device, "fast_tier": "RAM" if device.startswith("cpu") else
                              "device", "memory": repr(model.memory) if model.memory is not None else None,
                              "n_experts": hp.n_experts, "top_k": hp.n_experts_used, "tiers": None,
                              "slots": None, "total": None, "layers": []}
    if stats is None:
        return report
    residency = model.expert_residency()
    places = {row["layer"]: row for row in residency.to_dict()["per_layer"]} if residency is not None else {}
    counts, tokens = stats.routing()
    total = stats.totals()
    report["tiers"] = list(residency.tiers) if residency is not None else None
    report["slots"] = _slots(model, report["tiers"])
    report["total"] = {**total, "tokens": tokens, **_rates(total, tokens)}
    report["layers"] = [_layer_row(row, int(stats.routing_tokens[i]), counts[i].tolist(), places.get(row["layer"]))
                        for i, row in enumerate(stats.per_layer())]
    return report


__all__ = ["ASSETS", "PAGES", "add_routes", "asset", "memory_report"]
