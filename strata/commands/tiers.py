"""How the commands name the expert memory's tiers, in words that fit the machine, and the
--stats lines of its counters.

The memory's counters say "device" for the fast tier whatever the device is (`MemoryStats`: the
tier compute reads experts from). On a machine without GPU that tier is RAM, so the commands say
"RAM slots" and "RAM hits" there and "device slots" / "device hits" on CUDA; the host tier is
"host RAM" on both.

Must not compute: every figure comes from `MemoryStats.totals()` / `per_layer()` or the
commands' results; this module words and lays them out.
"""
from __future__ import annotations

from typing import Any

from strata.units import format_bytes


def fast_tier(device: Any) -> str:
    """The name of the tier compute reads experts from: "RAM" on the CPU, "device" on a GPU."""
    return "RAM" if str(device).split(":")[0] == "cpu" else "device"


def column(device: Any) -> str:
    """Short column header of that tier's hits in tables: "ram.hit" or "dev.hit"."""
    return "ram.hit" if fast_tier(device) == "RAM" else "dev.hit"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def format_prediction_depths(scores: dict[str, list[dict]], indent: str = "  ") -> list[str]:
    """One line per predictor: precision / recall at each depth (`PredictionScore.to_dict()`)."""
    return [f"{indent}{name}: " + ", ".join(f"+{r['depth']} precision {_pct(r['precision'])} recall "
                                           f"{_pct(r['recall'])}" for r in rows)
            for name, rows in scores.items()]


def _ratio(actual: float, optimal: float) -> str:
    return f"{actual / optimal:.2f}x" if optimal else ("optimal" if not actual else "optimal reads none")


def format_memory_stats(stats, device: Any, per_layer: bool = True, optimal: int | None = None) -> str:
    """--stats: the expert memory's totals, then one line per layer (`stats` a MemoryStats);
    `optimal`: the disk bytes Belady's policy would have read for the same routing."""
    t, fast = stats.totals(), fast_tier(device)
    tokens = int(stats.routing_tokens.max(initial=0))
    lines = [
        f"expert memory: {t['requests']} expert requests: {fast} hits {t['device_hits']} "
        f"({100 * t['device_hit_rate']:.1f}%), late prefetches {t['device_late']}, misses "
        f"{t['device_misses']} (host hits {t['host_hits']}, disk reads {t['disk_reads']}); "
        f"placed at start-up {t['startup_loads']}",
        f"  bytes: disk -> host {format_bytes(t['bytes_disk'])}, host -> {fast} slots "
        f"{format_bytes(t['bytes_to_device'])}; evictions {t['evictions']}",
        *([] if optimal is None or not tokens else [
            f"  disk bytes per token {format_bytes(t['bytes_disk'] / tokens)}; Belady's optimal for the same "
            f"routing and slots {format_bytes(optimal / tokens)} ({_ratio(t['bytes_disk'], optimal)})"]),
        f"  compute waited {t['wait_s']:.3f} s for experts; dequantization {t['dequant_s']:.3f} s"
        + (f"; computed on the CPU {t['cpu_computed']} ({t['cpu_s']:.3f} s)" if t["cpu_computed"] else ""),
        *([f"  miss stand-ins: {t['stand_in_type']} copies of every expert in RAM, "
           f"{format_bytes(t['stand_in_bytes'])} of the budget; misses computed from them {t['stand_ins']}"]
          if t.get("stand_in_bytes") else []),
        f"  prefetch: issued {t['prefetch_issued']}, used {t['prefetch_used']}, refused "
        f"{t['prefetch_refused']}, cancelled {t['prefetch_cancelled']}; prediction precision "
        f"{_pct(t['precision'])}, recall {_pct(t['recall'])}; not loaded (p below the read cost) "
        f"{t['prefetch_unpaid']}",
        *format_prediction_depths(stats.prediction_score.to_dict(), "    by depth, "),
    ]
    if per_layer:
        lines.append(f"  layer  requests  {column(device)}  late  miss  host.hit  disk  wait_s  precision  recall")
        for r in stats.per_layer():
            lines.append(f"  {r['layer']:>5}  {r['requests']:>8}  {r['device_hits']:>7}  {r['device_late']:>4}  "
                         f"{r['device_misses']:>4}  {r['host_hits']:>8}  {r['disk_reads']:>4}  "
                         f"{r['wait_s']:>6.3f}  {_pct(r['precision']):>9}  {_pct(r['recall']):>6}")
    return "\n".join(lines)


__all__ = ["column", "fast_tier", "format_memory_stats", "format_prediction_depths"]
