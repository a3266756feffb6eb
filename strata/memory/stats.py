"""Counters of the tiered expert memory, per expert layer and in total: plain numbers, no tensors.

Demand requests (experts the model acquired) end in exactly one of three places on the device:

    requests = device_hits + device_late + device_misses
      device_hits    the expert was ready in a device slot
      device_late    a prefetch of it was still in flight: compute waited for (or took over) that load
      device_misses  not in a device slot: loaded on demand, from the host tier or the disk
    device_misses = host_hits + disk_reads

Predicted experts not loaded because their probability does not pay for the read
(`TieredConfig.prefetch_read_cost`) count in `prefetch_unpaid`. Loads started by prefetch count separately (prefetch_host_hits + prefetch_disk_reads = prefetch
loads that ran). Bytes: `bytes_disk` is the payload the pager read into host slots (slab sizes);
`bytes_to_device` what was written into device slots (packed bytes, or dequantized values).

Hybrid compute (CUDA, `TieredConfig.hybrid`): `cpu_computed` counts experts computed on the CPU
from their host slots instead of being acquired on the device (not in `requests`: those are
device requests); `cpu_s` is the time of those CPU calls.

Times are seconds: `wait_s` is how long compute blocked in `start` / `finish` for experts (demand loads,
waits for prefetches in flight and, on CUDA, for their copies to finish); `dequant_s` the time
in dequantization calls (filling dequantized slots, or dequantizing packed slots at use; on
CUDA the time to queue those kernels, not their run time).

Prefetch quality is scored per layer step where a prediction was made: `predicted` experts
announced, `actual` experts then routed, `predicted_correct` in both. Precision =
correct / predicted, recall = correct / actual. `prefetch_used` counts prefetched experts
acquired while their slot still held them. `startup_loads` counts the experts placed in device
slots at start-up from the file's routing statistics (not requests, not misses).

Routing: `routing_counts` int64 [L, E] counts every routing decision the memory observed (uses of
each expert, prefill and decode), over `routing_tokens` [L] tokens; `--save-routing` writes them
for `python -m strata.convert --routing-stats`. With `start_trace`, every routed token is also kept
in order (`trace()`: indices [L, T, K], the `shared/traces/` format), for `--save-trace` and for
replaying the run's own routing through Belady's optimal policy (`strata bench MODEL`, `--stats`).

`Residency` is the other half of the picture: where each expert sits at one moment (the page
tables of the memory's pools, fastest first, read without stopping the engine, so it may be a
load behind; an expert whose load is in flight counts in the tier it is loading into).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .predict.score import PredictionScore


#: Integer counters, one [L] array each (L = expert layers).
COUNTERS = ("requests", "device_hits", "device_late", "device_misses", "host_hits", "disk_reads",
            "prefetch_issued", "prefetch_refused", "prefetch_cancelled", "prefetch_used",
            "prefetch_host_hits", "prefetch_disk_reads", "bytes_disk", "bytes_to_device",
            "prefetch_unpaid", "predicted", "actual", "predicted_correct", "evictions", "startup_loads", "cpu_computed",
            "stand_ins")
#: Second totals, one [L] array each.
TIMERS = ("wait_s", "dequant_s", "cpu_s")


class MemoryStats:
    """Per-layer counters (`stats.requests[i]` for the i-th expert layer) and their totals."""

    def __init__(self, layers: Sequence[int], n_experts: int = 0):
        self.layers = list(layers)  # model layer number of each expert layer
        n = len(self.layers)
        for name in COUNTERS:
            setattr(self, name, np.zeros(n, dtype=np.int64))
        for name in TIMERS:
            setattr(self, name, np.zeros(n, dtype=np.float64))
        self.routing_counts = np.zeros((n, n_experts), dtype=np.int64)  # [L, E]
        self.routing_tokens = np.zeros(n, dtype=np.int64)  # [L]
        self.prediction_score = PredictionScore()  # precision/recall per predictor and depth
        self.recorder: TraceRecorder | None = None  # opt-in: it grows with every token
        self.trace_origin: Any = None  # the caller's note of where the trace began (start_trace)
        self.stand_in_bytes, self.stand_in_type = 0, ""  # set by a memory with miss stand-ins

    def reset(self) -> None:
        for name in COUNTERS + TIMERS + ("routing_counts", "routing_tokens"):
            getattr(self, name)[:] = 0
        self.prediction_score.reset()
        if self.recorder is not None:
            self.recorder = TraceRecorder(len(self.layers))
        self.trace_origin = None

    def start_trace(self, origin: Any = None) -> None:
        """Keep every routed token from now on (and after each `reset`); see `trace`. `origin` is
        kept until the next `reset`: what a replay of the trace needs to know of its start (the
        residency of the tier that reads the disk, `strata.bench.cache.disk_tier`)."""
        self.recorder = TraceRecorder(len(self.layers))
        self.trace_origin = origin

    def trace(self) -> np.ndarray | None:
        """indices int16 [L, T, K] of the tokens routed since `start_trace` or `reset`; None when
        not recording."""
        return None if self.recorder is None else self.recorder.indices()

    def record_routing(self, li: int, expert_ids: np.ndarray) -> None:
        """Expert layer `li` routed tokens to `expert_ids` [T, K]; no allocation beyond numpy's
        (and the recorder's, when tracing)."""
        np.add.at(self.routing_counts[li], expert_ids.ravel(), 1)
        self.routing_tokens[li] += expert_ids.shape[0] if expert_ids.ndim > 1 else 1
        if self.recorder is not None:
            self.recorder.add(li, expert_ids)

    def record_routing_layers(self, lis: np.ndarray, expert_ids: np.ndarray) -> None:
        """`record_routing` of distinct expert layers `lis` at once (expert_ids [len(lis), T, K])."""
        if not len(lis):
            return
        np.add.at(self.routing_counts, (np.repeat(lis, expert_ids[0].size), expert_ids.reshape(-1)), 1)
        self.routing_tokens[lis] += expert_ids.shape[1]
        if self.recorder is not None:
            for li, ids in zip(np.asarray(lis).tolist(), expert_ids):
                self.recorder.add(li, ids)

    def routing(self) -> tuple[np.ndarray, int]:
        """(counts [L, E], tokens): every layer sees every token, so tokens is the layers' maximum."""
        return self.routing_counts.copy(), int(self.routing_tokens.max(initial=0))

    def total(self, name: str) -> float:
        return getattr(self, name).sum().item()

    def totals(self) -> dict[str, Any]:
        """Every counter summed over layers, with the derived rates."""
        t = {name: int(self.total(name)) for name in COUNTERS}
        t.update({name: float(self.total(name)) for name in TIMERS})
        t.update(stand_in_bytes=self.stand_in_bytes, stand_in_type=self.stand_in_type)
        return {**t, **_rates(t)}

    def per_layer(self) -> list[dict[str, Any]]:
        rows = []
        for i, layer in enumerate(self.layers):
            row = {name: int(getattr(self, name)[i]) for name in COUNTERS}
            row.update({name: float(getattr(self, name)[i]) for name in TIMERS})
            rows.append({"layer": layer, **row, **_rates(row)})
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.totals(), "per_layer": self.per_layer(),
                "prediction_depths": self.prediction_score.to_dict()}


class TraceRecorder:
    """Every token's routed experts, per expert layer, in the order the memory saw them (a batch
    step's tokens in batch order). Every layer sees every token, so the layers line up by token."""

    def __init__(self, n_layers: int):
        self.rows: list[list[np.ndarray]] = [[] for _ in range(n_layers)]

    def add(self, li: int, expert_ids: np.ndarray) -> None:
        ids = np.asarray(expert_ids)
        self.rows[li].append(ids.reshape(-1, ids.shape[-1]).astype(np.int16))  # [T, K]

    def indices(self) -> np.ndarray:
        """int16 [L, T, K]; T is the fewest tokens any layer saw (a run stopped mid-token)."""
        per_layer = [np.concatenate(r) if r else np.zeros((0, 0), np.int16) for r in self.rows]
        n_tokens = min(len(r) for r in per_layer) if per_layer else 0
        k = max(r.shape[1] for r in per_layer) if per_layer else 0
        if n_tokens == 0:
            return np.zeros((len(per_layer), 0, k), dtype=np.int16)
        return np.stack([r[:n_tokens] for r in per_layer])


@dataclass(frozen=True)
class Residency:
    """Where every routed expert sits: `tier[i, e]` indexes `tiers` (fastest first; the last,
    "disk", is the file: what no pool holds) for expert e of the i-th expert layer."""

    layers: list[int]  # model layer number of each expert layer
    tiers: tuple[str, ...]
    tier: np.ndarray  # int8 [L, E]

    @classmethod
    def from_tables(cls, layers: Sequence[int], names: Sequence[str], tables: Sequence[np.ndarray]) -> "Residency":
        """From page tables int32 [L, E] (slot, or -1 when absent), one per pool named in `names`,
        fastest first: an expert is in the fastest pool that holds it, else on the disk."""
        tier = np.full(tables[0].shape, len(tables), dtype=np.int8)
        for i in reversed(range(len(tables))):
            tier[np.asarray(tables[i]) >= 0] = i
        return cls(list(layers), (*names, "disk"), tier)

    def counts(self) -> np.ndarray:
        """Experts per tier of each layer, int64 [L, len(tiers)]."""
        return np.stack([(self.tier == i).sum(axis=1) for i in range(len(self.tiers))], axis=1)

    def to_dict(self) -> dict[str, Any]:
        counts = self.counts()
        return {"tiers": list(self.tiers),
                "per_layer": [{"layer": layer, "tier": self.tier[i].tolist(),
                               "counts": dict(zip(self.tiers, counts[i].tolist()))}
                              for i, layer in enumerate(self.layers)]}


def _rates(c: dict[str, Any]) -> dict[str, float | None]:
    def ratio(a: float, b: float) -> float | None:
        return a / b if b else None

    return {"device_hit_rate": ratio(c["device_hits"], c["requests"]) or 0.0,
            "precision": ratio(c["predicted_correct"], c["predicted"]),
            "recall": ratio(c["predicted_correct"], c["actual"])}


__all__ = ["COUNTERS", "MemoryStats", "Residency", "TIMERS", "TraceRecorder"]
