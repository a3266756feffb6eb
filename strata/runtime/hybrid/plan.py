"""Hybrid CPU/GPU decision for missed experts on CUDA: compute on the CPU or copy to the device.

Plain numbers in, a plan out: no torch, no files, no threads. The engine measures, this module
decides; it must not time anything itself or touch the slot pool.

The situation. A layer's router chose experts that are not in device slots (misses). A missed
expert already in the host tier (pinned RAM, packed GGUF bytes) can go either way:

    copy: host -> device over PCIe, then the GPU computes it:   copy_latency_s + bytes / copy_bytes_per_s
    CPU:  the native quantized kernels compute it in place:      cpu_overhead_s + tokens x bytes / rate[format]

(the GPU's own compute of one expert's few tokens is microseconds and is left out; so is the
transfer of those tokens' hidden states, which is a few KiB.) The CPU cost is proportional to
tokens x bytes, the packed-matrix work: one token touches each weight byte once, T tokens T times
(the kernels tile over tokens, so this overestimates a prefill's CPU cost, which only errs
towards copying, the choice that also warms the device cache). A copy's cost does not depend on
the tokens. Hence Fiddler's rule: an expert with few tokens is cheaper on the CPU, a heavily
routed one is cheaper copied. Using the CPU at all costs `cpu_sync_s` once per layer (handing the
hidden states over and waiting for the result).

Serial (`overlap=False`): CPU work and copies add up, so each expert takes its cheaper side, and
the CPU is used at all only when the sum of what it saves exceeds `cpu_sync_s`.

Overlapped (`overlap=True`): the CPU computes its share while the copy engine copies the rest
and the GPU works on the hits (`device_busy_s`, the device side's time regardless); the layer
ends at the makespan max(cpu total, max(device_busy_s, copy total)). This is scheduling on two
unrelated machines (NP-hard in general), so the split (the CPU share issue 9 cites llama.cpp's
`--moe-cache-cpu-share` for) is the greedy of its LP relaxation: order the experts by cpu cost / copy cost
(most CPU-friendly first), try every prefix of that order as the CPU's share, keep the prefix of
least makespan (ties: the shorter prefix, so fewer CPU experts), then offer the CPU each later
expert in turn, kept if it shortens the makespan (the prefix stops at the first expert too big
for what is left; smaller ones after it may still fit). Along the order the CPU's total only
grows and the copies' only shrink, so the prefix makespan falls then rises; the whole is O(n)
after the sort. The prefix is the rounding of the split's LP relaxation (one fractional expert),
so it is within one expert's cost of the optimum; on random layers of up to 8 misses the result
is the optimum in ~88% of them and 0.8% above it on average (tests/memory/test_hybrid.py). The
empty prefix (copy everything) is a candidate, so the plan is never slower than copying
everything, and the CPU's share never takes longer than that either.

Unknown costs decide nothing: an expert whose format has no measured CPU rate, any expert when the
copy rate is unknown (0 or absent), and every expert not in the host tier (it must come from the
disk through the pager and the copy pipeline in any case) is copied. Copying is always correct;
the CPU is an optimisation taken only on evidence.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

CPU, COPY = "cpu", "copy"


@dataclass(frozen=True)
class ExpertMiss:
    """One missed expert of a layer: its id, the tokens routed to it this step, its packed bytes
    (gate + up + down), whether the host tier holds it, and its GGUF format (selects the CPU rate)."""

    expert_id: int
    n_tokens: int
    n_bytes: int
    in_host: bool
    format: str = "Q4_K"


@dataclass
class HybridRates:
    """Measured costs. Rates of 0 (or a format missing from `cpu_token_bytes_per_s`) mean unknown.

    cpu_token_bytes_per_s[format]: tokens x packed bytes the CPU kernels get through per second.
    cpu_overhead_s: fixed cost of one expert on the CPU (call, activation quantization).
    cpu_sync_s: fixed cost per layer of using the CPU at all (hand-over and wait).
    copy_bytes_per_s: host -> device copy rate; copy_latency_s: fixed cost of one copy.
    alpha: weight of a new observation in the moving averages.
    """

    cpu_token_bytes_per_s: dict[str, float] = field(default_factory=dict)
    cpu_overhead_s: float = 0.0
    cpu_sync_s: float = 0.0
    copy_bytes_per_s: float = 0.0
    copy_latency_s: float = 0.0
    alpha: float = 0.2

    def cpu_seconds(self, n_tokens: int, n_bytes: int, fmt: str) -> float | None:
        """Predicted CPU time of one expert, or None when its format's rate is unknown."""
        rate = self.cpu_token_bytes_per_s.get(fmt, 0.0)
        return self.cpu_overhead_s + n_tokens * n_bytes / rate if rate > 0 else None

    def copy_seconds(self, n_bytes: int) -> float | None:
        """Predicted host -> device copy time of one expert, or None when the copy rate is unknown."""
        return self.copy_latency_s + n_bytes / self.copy_bytes_per_s if self.copy_bytes_per_s > 0 else None

    def observe_cpu(self, fmt: str, n_tokens: int, n_bytes: int, seconds: float) -> None:
        """Fold in one timed CPU expert computation (overhead included in `seconds`)."""
        work = n_tokens * n_bytes
        if work > 0 and seconds > 0:
            old = self.cpu_token_bytes_per_s.get(fmt, 0.0)
            self.cpu_token_bytes_per_s[fmt] = self._average(old, work, max(seconds - self.cpu_overhead_s, 1e-9))

    def observe_copy(self, n_bytes: int, seconds: float) -> None:
        """Fold in one timed host -> device copy (latency included in `seconds`)."""
        if n_bytes > 0 and seconds > 0:
            self.copy_bytes_per_s = self._average(self.copy_bytes_per_s, n_bytes,
                                                  max(seconds - self.copy_latency_s, 1e-9))

    def _average(self, old_rate: float, work: float, seconds: float) -> float:
        # The average runs over seconds per unit of work, not over rates: times add up along the
        # decode step, so one slow observation weighs as the time it cost (a rate average would
        # let one fast outlier hide it). The first observation is taken as it is.
        if not 0 < self.alpha <= 1:
            raise ValueError(f"HybridRates.alpha must be in (0, 1], found {self.alpha}")
        new_inv = seconds / work
        inv = new_inv if old_rate <= 0 else (1 - self.alpha) / old_rate + self.alpha * new_inv
        return 1.0 / inv


@dataclass(frozen=True)
class HybridPlan:
    """Where each missed expert goes (`placement[expert_id]` is "cpu" or "copy") and the predicted
    seconds: CPU share, copies, and the layer's total (sum when serial, makespan when overlapped)."""

    placement: dict[int, str]
    cpu_s: float
    copy_s: float
    total_s: float

    @property
    def cpu_experts(self) -> list[int]:
        return [e for e, p in self.placement.items() if p == CPU]

    @property
    def copy_experts(self) -> list[int]:
        return [e for e, p in self.placement.items() if p == COPY]


def plan_misses(misses: Sequence[ExpertMiss], rates: HybridRates, *, overlap: bool = True,
                device_busy_s: float = 0.0) -> HybridPlan:
    """Decide, for each missed expert of one layer, "cpu" or "copy" (see the module comment).

    `device_busy_s` (overlap only): time the device side spends on this layer regardless of the
    misses (computing the hits), which the CPU's share may fill for free.
    """
    ids = [m.expert_id for m in misses]
    if len(set(ids)) != len(ids):
        raise ValueError(f"plan_misses: expert ids repeat in {ids}")
    copy_cost, cpu_cost = {}, {}
    for m in misses:
        if m.n_tokens < 0 or m.n_bytes < 0:
            raise ValueError(f"plan_misses: expert {m.expert_id} has {m.n_tokens} tokens and {m.n_bytes} bytes")
        copy_cost[m.expert_id] = rates.copy_seconds(m.n_bytes)
        cpu = rates.cpu_seconds(m.n_tokens, m.n_bytes, m.format) if m.in_host else None
        if cpu is not None and copy_cost[m.expert_id] is not None:
            cpu_cost[m.expert_id] = cpu
    copy_all = sum(c or 0.0 for c in copy_cost.values())
    candidates = sorted(cpu_cost, key=lambda e: (cpu_cost[e] / max(copy_cost[e], 1e-12), e))
    if overlap:
        chosen = _overlapped_split(candidates, cpu_cost, copy_cost, copy_all, rates.cpu_sync_s, device_busy_s)
    else:
        saving = {e: copy_cost[e] - cpu_cost[e] for e in candidates}
        chosen = [e for e in candidates if saving[e] > 0]
        if sum(saving[e] for e in chosen) <= rates.cpu_sync_s:
            chosen = []
    cpu_s = sum(cpu_cost[e] for e in chosen) + (rates.cpu_sync_s if chosen else 0.0)
    copy_s = copy_all - sum(copy_cost[e] for e in chosen)
    total = max(cpu_s, device_busy_s, copy_s) if overlap else cpu_s + copy_s
    chosen_set = set(chosen)
    return HybridPlan({e: CPU if e in chosen_set else COPY for e in ids}, cpu_s, copy_s, total)


def _overlapped_split(order: list[int], cpu_cost: dict[int, float], copy_cost: dict[int, float | None],
                      copy_all: float, sync_s: float, device_busy_s: float) -> list[int]:
    """The CPU's share: the prefix of `order` of least makespan (the shortest among equals), then
    each later expert that still shortens the makespan."""
    def makespan(cpu_s: float, copy_s: float) -> float:
        return max(cpu_s, device_busy_s, copy_s)

    best_k, best = 0, makespan(0.0, copy_all)
    cpu_s, copy_s = sync_s, copy_all
    for k, e in enumerate(order, start=1):
        cpu_s, copy_s = cpu_s + cpu_cost[e], copy_s - copy_cost[e]
        if makespan(cpu_s, copy_s) < best * (1 - 1e-12):
            best_k, best = k, makespan(cpu_s, copy_s)
    chosen = order[:best_k]
    cpu_s = sync_s + sum(cpu_cost[e] for e in chosen)
    copy_s = copy_all - sum(copy_cost[e] for e in chosen)
    for e in order[best_k + 1:]:  # the prefix stopped at an expert too big for the CPU: smaller ones may fit
        if makespan(cpu_s + cpu_cost[e], copy_s - copy_cost[e]) < best * (1 - 1e-12):
            cpu_s, copy_s = cpu_s + cpu_cost[e], copy_s - copy_cost[e]
            best = makespan(cpu_s, copy_s)
            chosen.append(e)
    return chosen


__all__ = ["COPY", "CPU", "ExpertMiss", "HybridPlan", "HybridRates", "plan_misses"]
