"""Start-up placement of `TieredExpertMemory`: the file's routing statistics seed both tiers.

When the file carries routing statistics (`ModelFile.routing_counts()`, the `strata.routing.*`
metadata), both tiers' policies are seeded with them and each layer's hottest experts are loaded
into its host slots, then its device slots, in the memory's constructor, before decoding and
before the loader thread starts (nothing else moves slots yet): counted as `startup_loads`, not
as misses. Without them the slots start empty and the policies' decayed counts warm up from the
first tokens' routing. Must not run once decoding has started.
"""
from __future__ import annotations

from .host import HostLoad
from .loader import COMPUTE
from .policy import PoolExhaustedError


def place_initial(memory) -> None:
    """Seed `memory`'s (a `TieredExpertMemory`) policies from its file's routing statistics and
    load each layer's hottest experts; a no-op when the file has none."""
    routing = memory.model_file.routing_counts()  # ([L, E], n_tokens) or None
    if routing is None:
        return
    memory.policy.seed_counts(*routing)
    memory.host.seed_counts(*routing)
    for li, e in memory.host.policy.initial_placement():
        memory.host.wait(_host_load(memory, memory.layers.layer(li), e))
    for li, e in memory.policy.initial_placement():
        layer = memory.layers.layer(li)
        with memory._lock:
            slot, _ = memory.policy.admit(li, e)
            memory._start_load(slot, COMPUTE)
        memory._fill(layer, li, e, slot, memory._host_wait(layer, e, _host_load(memory, layer, e)))
        memory.stats.startup_loads[li] += 1
    placed = memory.stats.startup_loads.copy()
    memory.stats.reset()  # start-up loads are not decode traffic
    memory.stats.startup_loads[:] = placed


def _host_load(memory, layer: int, e: int) -> HostLoad:
    """A host load at start-up; host slots still pinned by device copies (CUDA) are let go when the
    layer's pool is full."""
    try:
        return memory.host.load(layer, e)
    except PoolExhaustedError:
        memory._drain_unpins(block=True)
        return memory.host.load(layer, e)


__all__ = ["place_initial"]
