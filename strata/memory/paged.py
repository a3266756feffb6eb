"""One RAM tier for packed compute on the CPU: `PagedExpertMemory`.

    model = strata.load(path, memory="paged", host_mem="1500M")   # the experts' RAM budget

On the CPU the tiered memory's device slots and its host tier are both RAM: a miss is read from
the disk into a host slot and then copied into a device slot, and an expert may take RAM twice.
Here the host tier's compact slot pool (`host.py`, compact=True) is the only copy: the pager reads
a missing expert straight into its slot (O_DIRECT where the file system allows it, unless the
budget holds every expert: then through the page cache, as nothing is ever evicted), the slab is
moved to the start of its region, and the native kernels compute from the slot in place. The
whole budget holds experts, and a miss costs one read and no copy.

Placement is the host tier's `ExpertPolicy` (decayed use counts, per-layer budgets), seeded from
the file's routing statistics when it has them. There is no prefetch across layers: a layer's
misses are queued by `start` (which hands back the experts already in RAM, so the fused MoE call
computes them while the pager reads the rest) and waited for by `finish`, or all at once by
`acquire`; each load finishes (or is undone) before the layer ends, so between steps the page
table is exact: the memory's experts are `fixed` (`fixed_packed`), and the decode program runs
every layer whose experts are all in their slots, handing the others back to the memory.

Miss stand-ins (`miss_stand_in="q2_k"`, `strata.memory.standin`): a low-bit copy of every expert,
built at load and taken from the budget; a miss is then computed from its stand-in at once. In
"background" mode the full expert's read is queued without waiting for it (so its next use hits)
when a slot is free or the expert is used more often (decayed use rate) than the one it would
evict: with the stand-ins taking most of the budget, reading every miss would evict experts
about to be used again and read several times the bytes of no stand-ins at all. Those reads
finish by the layer's next acquire or the next `check_fixed` (before a decode program
step), which keeps the page table exact for the program. In "instead" mode a miss is read (in the
background) only into a free slot: once a layer's slots are full nothing is read or evicted.

Must not compute: it moves bytes and counts them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from strata import native
from strata.errors import StrataError
from strata.gguf import ModelFile
from strata.units import format_bytes

from .base import ExpertLayers, ExpertMemory, FixedExperts, PackedExperts, check_acquire
from .budget import DEFAULT_PAGER_THREADS, host_budget_for_slots, parse_bytes
from .host import HostLoad, HostTier
from .machine import Machine
from .placement import estimate, warn_if_slow
from .policy import PoolExhaustedError
from .standin import DEFAULT_STAND_IN_MODE, StandIns, check_stand_in_mode, stand_in_bytes, stand_in_type
from .startup import place_initial
from .stats import MemoryStats, Residency


@dataclass
class _Pending:
    """An acquire between its halves: slots by position (-1 while read), pinned experts, and the
    reads not yet waited for: (position, expert, load)."""

    slots: list[int]
    pinned: list[int]
    loads: list[tuple[int, int, HostLoad]]


class PagedExpertMemory(ExpertMemory, FixedExperts):
    """Packed experts paged from the model file into one pool of RAM slots (see the module).

    host_mem: the pool's budget (bytes or '1500M'; default `budget.default_host_budget`; `strata.load`
        gives `budget.paged_budget`). machine: the machine's memory it is checked against (`Machine`;
        default: measured here). pager_threads, direct: the pager's.
    miss_stand_in: a ggml type ('q2_k') of resident stand-ins for misses (None: off; their bytes
        come out of host_mem); stand_in_mode: "background" or "instead" (see the module).
    """

    kind = "paged"
    form = "packed"

    def __init__(self, model_file: ModelFile, *, host_mem: Any = None, pager_threads: int = DEFAULT_PAGER_THREADS,
                 direct: bool | None = None, machine: Machine | None = None, miss_stand_in: Any = None,
                 stand_in_mode: str | None = None) -> None:
        self.model_file = model_file
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.layers = ExpertLayers(model_file.expert_layers, model_file.path)
        self.n_experts = model_file.hparams.n_experts
        budget = parse_bytes(host_mem, "host memory budget (--host-mem)")
        self.stand_in_mode = check_stand_in_mode(stand_in_mode or DEFAULT_STAND_IN_MODE)
        self.stand_ins = None
        if miss_stand_in is not None:
            t = stand_in_type(miss_stand_in)
            if isinstance(budget, int):  # checked before minutes of building and gigabytes of copies
                budget = _slots_budget(model_file, budget, t, stand_in_bytes(model_file, t, self.layers))
            self.stand_ins = StandIns(model_file, t, self.layers, pager_threads)
        self._background: set[int] = set()  # layers with reads in flight nobody waits for (stand-in misses)
        if direct is None and isinstance(budget, int) and budget >= host_budget_for_slots(model_file, self.n_experts):
            # Every expert gets a slot and none is ever evicted: the pool is the model's RAM, so
            # read through the page cache (a file already cached is copied, not read again).
            direct = False
        self.host = self.disk_tier = HostTier(model_file, budget, n_threads=pager_threads, direct=direct, compact=True,
                             machine=machine)
        self.max_acquire = self.host.slots_per_layer
        self.placement = estimate(model_file, self.host.slots_per_layer, 0)
        warn_if_slow(model_file, self.placement, one_tier=True)  # once, at start: most experts would come from disk
        self.stats = MemoryStats(list(self.layers), self.n_experts)
        if self.stand_ins is not None:
            self.stats.stand_in_bytes, self.stats.stand_in_type = self.stand_ins.nbytes, self.stand_ins.type.name
        self._held: tuple[int, tuple[int, ...]] | None = None
        self._pending: _Pending | None = None
        try:
            place_initial(model_file, self.host, self.layers, self.stats)
        except BaseException:
            self.host.close()
            raise

    def __repr__(self) -> str:
        stand_in = "" if self.stand_ins is None else \
            f", {self.stand_ins.type.name} stand-ins for misses ({self.stand_in_mode})"
        return (f"PagedExpertMemory({self.model_file.path.name}, cpu, packed slots in RAM: "
                f"{self.host.slots_per_layer}/{self.n_experts} per layer, no prefetch{stand_in})")

    @property
    def fixed(self) -> FixedExperts:
        return self  # a property: the memory keeps no reference to itself

    @property
    def page_table(self) -> np.ndarray:
        """[L, E] int32: the slot holding each (expert layer, expert), -1 when not in RAM."""
        return self.host.policy.page_table

    # ---- the protocol ----------------------------------------------------------------------------

    def acquire(self, layer: int, expert_ids: Sequence[int]) -> PackedExperts:
        """Pin a slot holding each expert, reading the missing ones from the file (stand-ins or not)."""
        self._start(layer, expert_ids, stand_in=False)
        return self.finish(layer, expert_ids)

    def start(self, layer: int, expert_ids: Sequence[int]) -> PackedExperts:
        """The first half of `acquire`: pins the experts already in RAM and queues the reads of
        the others (all of them before any wait, so the pager's threads overlap them), then
        returns at once. The index is -1 for an expert still being read: compute the others
        meanwhile, then `finish`. `release` undoes either half. With stand-ins, a miss comes as
        its stand-in (`PackedExperts.stand_in_index`) and nothing is left to wait for."""
        return self._start(layer, expert_ids, stand_in=self.stand_ins is not None)

    def _start(self, layer: int, expert_ids: Sequence[int], stand_in: bool) -> PackedExperts:
        ids = tuple(int(e) for e in expert_ids)
        li = self.layers.index(layer)
        check_acquire(self._held, layer, ids, self.max_acquire)
        t0 = time.perf_counter()
        if layer in self._background:  # the reads the last stand-ins left (a token ago: done by now, as a rule)
            self._background.discard(layer)
            self.host.reap(layer)
        slots: list[int] = [-1] * len(ids)
        pinned: list[int] = []
        try:
            # hits first, pinned at once: a miss's load may evict any unpinned expert of the layer
            for i, e in enumerate(ids):
                slot = self.host.pin_slot_if_ready(layer, e)
                if slot is not None:
                    pinned.append(e)
                    slots[i] = slot
            evicted = self.host.counters["evictions"]
            misses = [(i, e) for i, e in enumerate(ids) if slots[i] < 0]
            loads = self._background_loads(layer, misses) if stand_in else \
                [(i, e, self.host.load(layer, e)) for i, e in misses]
            self.stats.evictions[li] += self.host.counters["evictions"] - evicted
        except BaseException:
            self._undo(layer, pinned)
            raise
        self._held = (layer, ids)
        self._pending = _Pending(slots, pinned, [] if stand_in else loads)
        n_miss = len(misses)
        self.stats.requests[li] += len(ids)
        self.stats.device_hits[li] += len(ids) - n_miss
        self.stats.device_misses[li] += n_miss
        self.stats.disk_reads[li] += len(loads)
        self.stats.bytes_disk[li] += sum(s.nbytes for _, e, _ in loads for s in self.model_file.expert_slabs(layer, e))
        self.stats.wait_s[li] += time.perf_counter() - t0
        if not stand_in or not misses:
            return PackedExperts(self.host.layer_parts(layer), list(slots))
        self.stats.stand_ins[li] += n_miss
        return PackedExperts(self.host.layer_parts(layer), list(slots), self.stand_ins.parts(layer),
                             [e if s < 0 else -1 for e, s in zip(ids, slots)])

    def _background_loads(self, layer: int, misses: list[tuple[int, int]]) -> list[tuple[int, int, HostLoad]]:
        """Stand-ins serve `misses` (position, expert); queue the reads of those worth a slot,
        waited for by nobody in this acquire: in "background" mode a missed expert takes a free
        slot or the slot of an expert used less often than itself (the slots follow the hottest
        experts; a miss never evicts a hotter one), in "instead" mode only a free slot (the slots
        fill once, then stay)."""
        loads = []
        li = self.layers.index(layer)
        rates = self.host.policy.use_rate(li) if self.stand_in_mode == "background" else None
        for i, e in misses:
            try:
                load = self.host.load_over(layer, e, 0.0 if rates is None else float(rates[e]))
            except PoolExhaustedError:
                break
            if load is not None and not load.hit:
                loads.append((i, e, load))
        if loads:
            self._background.add(layer)
        return loads

    def finish(self, layer: int, expert_ids: Sequence[int]) -> PackedExperts:
        """The second half of `acquire`: waits for the reads `start` queued and pins those experts
        too. Returns every expert's slot."""
        ids = tuple(int(e) for e in expert_ids)
        if self._held != (layer, ids) or self._pending is None:
            raise RuntimeError(f"finish(layer={layer}, {list(ids)}) without its start: held {self._held}")
        li, p = self.layers.index(layer), self._pending
        t0 = time.perf_counter()
        try:
            while p.loads:
                i, e, load = p.loads[0]
                self.host.wait(load, pin=True)
                p.loads.pop(0)
                p.pinned.append(e)
                p.slots[i] = load.slot
        finally:
            self.stats.wait_s[li] += time.perf_counter() - t0
        return PackedExperts(self.host.layer_parts(layer), list(p.slots))

    def release(self, layer: int, expert_ids: Sequence[int]) -> None:
        ids = tuple(int(e) for e in expert_ids)
        if self._held != (layer, ids):
            raise RuntimeError(f"release(layer={layer}, {list(ids)}) does not match what is held: {self._held}")
        self._undo(layer, self._pending.pinned if self._pending is not None else [],
                   bool(self._pending is not None and self._pending.loads))
        self._held = self._pending = None

    def _undo(self, layer: int, pinned: Sequence[int], reap: bool = True) -> None:
        """Unpin `pinned`; with `reap`, finish the layer's loads nobody will wait for (a slot must
        not stay LOADING: the program would take it for a loaded expert)."""
        for e in pinned:
            self.host.unpin(layer, e)
        if reap:
            self.host.reap(layer)

    def observe(self, layer: int, expert_ids: torch.Tensor) -> None:
        """The router of `layer` chose `expert_ids` [T, K]: the policy's use counts and the
        routing statistics."""
        li = self.layers.index(layer)
        ids = expert_ids.detach().to("cpu", torch.int64).numpy()
        self.host.record(layer, ids)
        self.stats.record_routing(li, ids)

    def fixed_packed(self, layer: int) -> tuple[native.MoeParts, torch.Tensor]:
        """The slot pool and the layer's page table row (a live view): between steps every slot
        in it holds its expert, ready (loads finish before the layer ends)."""
        li = self.layers.index(layer)
        return self.host.layer_parts(layer), torch.from_numpy(self.host.policy.page_table[li])

    def check_fixed(self) -> None:
        """Before a decode program step: the stand-ins' background reads finish, so every slot the
        page table names holds its expert."""
        while self._background:
            self.host.reap(self._background.pop())

    def served_fixed(self, layer: int, expert_ids: torch.Tensor, n_used: int) -> None:
        self.observe(layer, expert_ids)
        li = self.layers.index(layer)
        self.stats.device_hits[li] += n_used
        self.stats.requests[li] += n_used

    def served_fixed_layers(self, layers: Sequence[int], expert_ids: torch.Tensor, n_used: Sequence[int]) -> None:
        lis = self.layers.indices(layers)
        ids = expert_ids.detach().to("cpu", torch.int64).numpy()  # [len(layers), T, K]
        self.host.record_layers(layers, ids)
        self.stats.record_routing_layers(lis, ids)
        n = np.asarray(n_used, dtype=np.int64)
        self.stats.device_hits[lis] += n
        self.stats.requests[lis] += n

    def memory_stats(self) -> MemoryStats:
        return self.stats

    def residency(self) -> Residency:
        """The one pool of RAM slots (counted as "device", as its hits are), then the disk."""
        return Residency.from_tables(self.layers.layers, ("device",), (self.page_table.copy(),))

    def close(self) -> None:
        self.host.close()


def _slots_budget(model_file: ModelFile, budget: int, t, size: int) -> int:
    """What stand-ins of `size` bytes of type `t` leave of the budget for the slots (they are
    counted in it), or a one-line error when that is less than each layer's top-k slots."""
    need = host_budget_for_slots(model_file, model_file.hparams.n_experts_used)
    if budget - size < need:
        raise StrataError(f"host memory budget {budget} bytes ({format_bytes(budget)}) is too small for "
                          f"{model_file.path.name} with {t.name} miss stand-ins: they take {format_bytes(size)} and "
                          f"each layer's top-{model_file.hparams.n_experts_used} slots need {format_bytes(need)} more; "
                          f"give at least {format_bytes(size + need)} or leave out --miss-stand-in")
    return budget - size


__all__ = ["PagedExpertMemory"]
