"""Start-up placement: the file's routing statistics seed the tiers, for every backend that pages.

When the file carries routing statistics (`ModelFile.routing_counts()`, the `strata.routing.*`
metadata), the policies are seeded with them and each layer's hottest experts are loaded into its
host slots, then (a memory with a device tier) its device slots, in the memory's constructor,
before decoding and before any loader thread starts (nothing else moves slots yet): counted as
`startup_loads` of the tier compute reads from, not as misses. Without them the slots start empty
and the policies' decayed counts warm up from the first tokens' routing. Must not run once
decoding has started.
"""
from __future__ import annotations

from typing import Callable

from strata.gguf import ModelFile

from .base import ExpertLayers
from .host import HostLoad, HostTier
from .policy import ExpertPolicy
from .stats import MemoryStats


def place_initial(model_file: ModelFile, host: HostTier, layers: ExpertLayers, stats: MemoryStats, *,
                  device: ExpertPolicy | None = None, fill: Callable[[int, int, int], None] | None = None,
                  host_load: Callable[[int, int], HostLoad] | None = None) -> None:
    """Seed the host tier's policy (and `device`, the device tier's) from the file's routing
    statistics and load each layer's hottest experts: into host slots with `host_load(layer, e)`
    (default `host.load`), then into device slots with `fill(layer, li, e)`. A no-op for a file
    without statistics. `stats` keeps only the `startup_loads` it counts."""
    routing = model_file.routing_counts()  # ([L, E], n_tokens) or None
    if routing is None:
        return
    if device is not None:
        device.seed_counts(*routing)
    host.seed_counts(*routing)
    host_load = host_load or host.load
    for li, e in host.policy.initial_placement():
        host.wait(host_load(layers.layer(li), e))
        stats.startup_loads[li] += device is None
    for li, e in device.initial_placement() if device is not None else ():
        fill(layers.layer(li), li, e)
        stats.startup_loads[li] += 1
    placed = stats.startup_loads.copy()
    stats.reset()  # start-up loads are not decode traffic
    stats.startup_loads[:] = placed


__all__ = ["place_initial"]
