"""The server's Prometheus metrics, in one registry per app (tests build several apps).

Names follow llama-server's and vLLM's style under a `strata:` prefix: requests running and
waiting, prompt and generated token totals (and the prompt tokens the prefix cache served), finished requests by reason, time to first token,
inter-token latency and whole-request latency histograms. Read at scrape time from the loaded
model: KV-cache use (blocks of the paged cache, or whole sequence slots of a slot cache: each
slot counts as one block there), the prefix cache's blocks, queries and hits (in tokens, as vLLM
counts them) and the expert memory's counters (`Model.memory_stats()`):
hits and misses per tier, bytes loaded into each tier, time compute waited for experts, and
prefetch precision and recall.

Must not schedule or format responses: the engine thread and the app record, Prometheus reads.
"""
from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class ServerMetrics:
    """Counters the engine thread and the app update; `render()` is the /metrics body."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests_running = Gauge("strata:requests_running", "Requests in the running batch.", registry=r)
        self.requests_waiting = Gauge("strata:requests_waiting", "Requests accepted and waiting for the batch.",
                                      registry=r)
        self.prompt_tokens = Counter("strata:prompt_tokens", "Prompt tokens processed.", registry=r)
        self.prompt_tokens_cached = Counter("strata:prompt_tokens_cached", "Prompt tokens whose KV the prefix "
                                            "cache held (not prefilled).", registry=r)
        self.generation_tokens = Counter("strata:generation_tokens", "Tokens generated.", registry=r)
        self.requests_finished = Counter("strata:request_success", "Requests finished, by finish reason "
                                         "(stop, length, abort: the client left).", ["finished_reason"], registry=r)
        self.requests_refused = Counter("strata:request_errors", "Requests answered with an error, by HTTP status.",
                                        ["status"], registry=r)
        self.ttft = Histogram("strata:time_to_first_token_seconds", "Time from arrival to the first generated token.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("strata:inter_token_latency_seconds", "Time between consecutive generated tokens "
                             "of a request.", buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("strata:e2e_request_latency_seconds", "Time from arrival to the last token.",
                             buckets=E2E_BUCKETS, registry=r)
        self._model = _ModelCollector()
        r.register(self._model)

    def attach(self, model: Any) -> None:
        """Read the KV cache and expert memory of `model` (a `strata.Model`) from now on."""
        self._model.model = model

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ModelCollector(Collector):
    """Gauges and counters read from the model at scrape time (nothing until it has loaded)."""

    def __init__(self) -> None:
        self.model: Any = None

    def collect(self) -> Iterator[Any]:
        if self.model is None:
            return
        yield from _kv_metrics(getattr(self.model, "cache", None))
        stats = self.model.memory_stats()
        if stats is not None:
            yield from _expert_metrics(stats.totals())


def _kv_metrics(cache: Any) -> Iterator[Any]:
    if cache is None:
        return
    if hasattr(cache, "n_blocks") and hasattr(cache, "n_free_blocks"):  # the paged cache
        total, free = cache.n_blocks, cache.n_free_blocks
    else:  # one contiguous region per sequence slot: a slot is the unit
        total, free = getattr(cache, "n_slots", 0), getattr(cache, "n_free", 0)
    yield GaugeMetricFamily("strata:kv_blocks_total", "KV-cache blocks in the pool.", value=total)
    yield GaugeMetricFamily("strata:kv_blocks_used", "KV-cache blocks held by sequences.", value=total - free)
    yield GaugeMetricFamily("strata:kv_cache_usage_ratio", "Fraction of KV-cache blocks in use (0 to 1).",
                            value=(total - free) / total if total else 0.0)
    if getattr(cache, "prefix_cache", False):
        yield GaugeMetricFamily("strata:prefix_cache_blocks", "KV-cache blocks registered in the prefix cache "
                                "(shared or evictable).", value=cache.n_cached_blocks)
        yield CounterMetricFamily("strata:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                  value=cache.n_queried)
        yield CounterMetricFamily("strata:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                                  value=cache.n_hit)


def _labelled(name: str, doc: str, label: str, values: dict[str, float]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, value in values.items():
        family.add_metric([key], value)
    return family


def _expert_metrics(t: dict[str, Any]) -> Iterator[Any]:
    """The tiered memory's totals (`strata.memory.stats`) as Prometheus families."""
    yield CounterMetricFamily("strata:expert_requests", "Experts the model acquired.", value=t["requests"])
    yield _labelled("strata:expert_hits", "Expert requests served from a tier: device (ready in a slot), "
                    "host (a device miss found in host RAM).", "tier",
                    {"device": t["device_hits"], "host": t["host_hits"]})
    yield _labelled("strata:expert_misses", "Expert requests a tier did not hold: device (loaded on demand), "
                    "host (read from disk).", "tier", {"device": t["device_misses"], "host": t["disk_reads"]})
    yield CounterMetricFamily("strata:expert_late_prefetches", "Expert requests that waited for a prefetch in "
                              "flight.", value=t["device_late"])
    yield _labelled("strata:expert_bytes_loaded", "Expert bytes written into a tier: host (read from disk), "
                    "device (copied or dequantized into device slots).", "tier",
                    {"host": t["bytes_disk"], "device": t["bytes_to_device"]})
    yield CounterMetricFamily("strata:expert_evictions", "Experts evicted from device slots.", value=t["evictions"])
    yield CounterMetricFamily("strata:expert_wait_seconds", "Time compute blocked waiting for experts.",
                              value=t["wait_s"])
    yield CounterMetricFamily("strata:expert_dequant_seconds", "Time in dequantization of experts.",
                              value=t["dequant_s"])
    yield _labelled("strata:prefetch_loads", "Expert loads started by prefetch, by outcome.", "outcome",
                    {"issued": t["prefetch_issued"], "used": t["prefetch_used"], "refused": t["prefetch_refused"],
                     "cancelled": t["prefetch_cancelled"]})
    yield _labelled("strata:prefetch_predictions", "Prefetch scoring: experts predicted, routed, and both.",
                    "kind", {"predicted": t["predicted"], "actual": t["actual"], "correct": t["predicted_correct"]})
    for name in ("precision", "recall"):
        if t[name] is not None:
            yield GaugeMetricFamily(f"strata:prefetch_{name}", f"Prefetch prediction {name} so far (0 to 1).",
                                    value=t[name])


__all__ = ["CONTENT_TYPE", "ServerMetrics"]
