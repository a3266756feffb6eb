"""Host tier: packed expert slabs cached in host RAM, read from the model file by the native pager.

    host = HostTier(model, budget=8 << 30)        # allocates its whole pool here, once
    load = host.load(layer, expert)               # a hit is already finished; a miss queues reads
    expert = host.wait(load, pin=True)            # HostExpert: uint8 views of gate, up and down
    native.dequantize_into(expert.slabs[2].ggml_type, expert.down, out)
    host.unpin(layer, expert_id)

Memory. One page-aligned pool (pinned on CUDA) is allocated at construction and carved into
fixed slots; afterwards loads only change which expert a slot holds. A slot holds one expert's
gate, up and down slabs, each in a region of its own:

    pool   uint8 [n_slots * slot_bytes]      slot s = pool[s * slot_bytes:(s + 1) * slot_bytes]
    slot   [gate region | up region | down region], each region A-aligned and
           round_up(largest slab of that part over the layers, A) + A bytes long

where A is the pager's O_DIRECT alignment. GGUF slabs are only 32-byte aligned, so a direct read
fetches the enclosing aligned range [floor(offset), ceil(offset + nbytes)), which is never longer
than round_up(nbytes, A) + A; the slab then starts `data_offset` bytes into its region. With
`compact=True` each finished read is moved to the start of its region (one memmove of the slab,
before the slot turns READY), so every part p of every slot starts at s * slot_bytes +
part_offset[p]: the pool is then one strided region per part that the native MoE kernels read in
place (the hybrid CPU compute of `strata/runtime/hybrid/split.py`).

Placement. Which expert occupies which slot is ExpertPolicy's decision (strata.memory.policy):
per-layer slot budgets, decayed use counts and hints; a LOADING or pinned slot is never a victim.
This module moves bytes and keeps the policy's page table in step with the reads: admit -> three
pager reads -> complete, or cancel when a read fails. Policy layers are the model's expert layers
in order (a dense lead layer has no slots); `ExpertLayers` maps them. Budgets and the slot layout
are `budget.py`'s.

Must not decide placement (the policy does) or compute anything: it moves bytes.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from strata.errors import NativeError, StrataError
from strata.gguf import PARTS, ExpertSlab, ModelFile
from strata import native
from strata.units import format_bytes

from . import alloc
from .base import ExpertLayers
from .parts import LayerParts
from .budget import DEFAULT_PAGER_THREADS, BudgetError, SlotLayout, check_host_budget, default_host_budget, slot_layout
from .machine import Machine
from .policy import READY, ExpertPolicy, PolicyConfig

PAGE = mmap.PAGESIZE
#: Ask for transparent huge pages for the pool (STRATA_HUGE_PAGES=0 to leave the kernel's default).
HUGE_PAGES = os.environ.get("STRATA_HUGE_PAGES", "1") != "0"


# ---- the pool ---------------------------------------------------------------------------------

def _allocate(nbytes: int, pinned: bool) -> np.ndarray:
    """`nbytes` of page-aligned host memory as uint8 [nbytes]; page-locked and registered with
    CUDA when `pinned`. The only allocation of the host tier."""
    # Private anonymous memory: page-aligned, faulted in on first write, charged as the process's own.
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if HUGE_PAGES and hasattr(mmap, "MADV_HUGEPAGE"):
        # 2 MiB pages where the kernel offers them (transparent huge pages, "madvise" or "always"):
        # reading an expert then walks one page table entry per 2 MiB instead of one per 4 KiB.
        buf.madvise(mmap.MADV_HUGEPAGE)
    alloc.record(nbytes, "host pool")
    pool = np.frombuffer(buf, dtype=np.uint8)
    if pinned:
        _register_with_cuda(pool)
    return pool


def _register_with_cuda(pool: np.ndarray) -> None:
    # cudaHostRegister on our own mapping rather than torch's pinned allocator, which rounds each
    # allocation up to a power of two (up to twice the budget, page-locked).
    import torch

    cudart, ptr = torch.cuda.cudart(), pool.ctypes.data
    err = int(cudart.cudaHostRegister(ptr, pool.nbytes, 0))
    if err != 0:
        raise StrataError(f"cannot pin {pool.nbytes} bytes of host memory for CUDA (cudaError {err}): "
                          f"lower the host budget or raise the locked-memory limit (ulimit -l)")
    weakref.finalize(pool.base, cudart.cudaHostUnregister, ptr)


# ---- loads and views --------------------------------------------------------------------------

class HostLoad:
    """One expert's load into a host slot; `HostTier.wait` completes it. A hit is born finished."""

    __slots__ = ("layer", "expert", "slot", "hit", "prefetch", "tickets", "offsets", "lock", "done", "error")

    def __init__(self, layer: int, expert: int, slot: int, hit: bool = False, prefetch: bool = False):
        self.layer, self.expert, self.slot, self.hit, self.prefetch = layer, expert, slot, hit, prefetch
        self.tickets: list[int] = []  # pager reads of gate, up, down
        self.offsets: list[int] = []  # data offsets of the reads collected so far
        self.lock = threading.Lock()
        self.done, self.error = hit, None

    def __repr__(self) -> str:
        state = "hit" if self.hit else "failed" if self.error else "done" if self.done else "loading"
        return f"HostLoad(layer={self.layer}, expert={self.expert}, slot={self.slot}, {state})"


@dataclass(frozen=True)
class HostExpert:
    """Packed bytes of one expert in its host slot, valid while the slot holds it (pin it)."""

    layer: int
    expert: int
    slot: int
    slabs: tuple[ExpertSlab, ExpertSlab, ExpertSlab]  # gate, up, down: ggml type and shape
    parts: tuple[np.ndarray, np.ndarray, np.ndarray]  # uint8 [slab.nbytes] views into the pool

    @property
    def gate(self) -> np.ndarray:
        return self.parts[0]

    @property
    def up(self) -> np.ndarray:
        return self.parts[1]

    @property
    def down(self) -> np.ndarray:
        return self.parts[2]


class HostTier:
    """Fixed slots of packed experts in host memory, filled from the model file by a Pager.

    budget: bytes of host memory (default: `budget.default_host_budget`, a share of available
        memory capped at what every expert takes). Each expert layer gets budget // slot_bytes // n_layers slots.
    machine: the machine's memory the budget is checked against (`Machine`; default: measured now).
    device: "cuda..." pins the pool for asynchronous copies; anything else leaves it pageable.
    n_threads, chunk_bytes, direct, fallback: the pager's (see strata.native.Pager).
    Thread-safe: loads, waits, pins and policy updates may come from several threads.
    """

    def __init__(self, model: ModelFile, budget: int | None = None, *, top_k: int | None = None,
                 device: str = "cpu", n_threads: int = DEFAULT_PAGER_THREADS, chunk_bytes: int = 0,
                 direct: bool | None = None, fallback: str = "pread",
                 policy_config: PolicyConfig | None = None, compact: bool = False,
                 machine: Machine | None = None) -> None:
        self.model, self.compact = model, compact
        self.layers = ExpertLayers(model.expert_layers, model.path)
        if not len(self.layers):
            raise ValueError(f"{model.path}: the model has no routed experts: nothing for a host tier to hold")
        self.top_k = top_k or model.hparams.n_experts_used
        self.pager = native.Pager(model, n_threads, chunk_bytes=chunk_bytes, direct=direct, fallback=fallback)
        try:
            self.layout = slot_layout(model, self.pager.info.align)
            machine = machine or Machine.measure()
            budget = default_host_budget(model, self.layout, machine) if budget is None else budget
            self.budget = check_host_budget(budget, model, self.layout, self.top_k, machine)
            per_layer = min(model.hparams.n_experts, self.budget // self.layout.slot_bytes // len(self.layers))
            self.policy = ExpertPolicy(len(self.layers), model.hparams.n_experts, per_layer,
                                       self.top_k, policy_config)
            self.pinned = str(device).startswith("cuda")
            self.pool = _allocate(self.policy.n_slots * self.layout.slot_bytes, self.pinned)  # [S * slot]
        except BaseException:
            self.pager.close()
            raise
        if native.numa_node_count() > 1:  # read on the CPUs next to the pool's memory
            self.pager.bind_node(native.numa_node_of(self.pool))
        self._data_offset = np.zeros((self.policy.n_slots, len(PARTS)), dtype=np.int64)  # [S, 3]
        self._loading: dict[int, HostLoad] = {}  # slot -> load in flight
        self._lock = threading.Lock()
        self._parts = LayerParts(self._pool_parts)
        self.counters = {"hits": 0, "misses": 0, "prefetches": 0, "refused_prefetches": 0,
                         "evictions": 0, "failed_loads": 0, "bytes_loaded": 0}

    def __repr__(self) -> str:
        return (f"HostTier({str(self.model.path)!r}, {self.n_slots} slots x {self.layout.slot_bytes} B = "
                f"{format_bytes(self.pool.nbytes)}{', pinned' if self.pinned else ''}, {self.pager!r})")

    @property
    def n_slots(self) -> int:
        return self.policy.n_slots

    @property
    def slots_per_layer(self) -> int:
        return int(self.policy.budgets[0])

    # ---- loads ---------------------------------------------------------------------------------

    def load(self, layer: int, expert: int) -> HostLoad:
        """Make (layer, expert) resident: a hit returns a finished load, a load in flight is
        returned as is, a miss takes a slot from the policy and queues its three reads. Raises
        PoolExhaustedError when every slot of the layer is pinned or loading."""
        return self._load(layer, expert, self.policy.admit)

    def load_over(self, layer: int, expert: int, value: float) -> HostLoad | None:
        """`load`, but a miss takes only a free slot or one whose expert's keep value is below
        `value` (`ExpertPolicy.admit_over`); None when refused."""
        return self._load(layer, expert, lambda li, e: self.policy.admit_over(li, e, value))

    def prefetch(self, layer: int, expert: int, prob: float = 1.0) -> HostLoad | None:
        """Load a predicted expert (needed with probability `prob`) if the policy finds it a slot
        without displacing anything worth more; None when refused. Resident: returns its load."""
        return self._load(layer, expert, lambda li, e: self.policy.admit_prefetch(li, e, prob), prefetch=True)

    def _load(self, layer: int, expert: int, admit, prefetch: bool = False) -> HostLoad | None:
        """The resident load of (layer, expert), else a new one into the slot `admit(layer index,
        expert)` reserves ((slot, evicted) or None: refused, nothing changed)."""
        with self._lock:
            li = self._index(layer)
            found = self._resident(layer, li, expert)
            if found is not None:
                return found
            admitted = admit(li, expert)
            if admitted is None:
                if prefetch:
                    self.counters["refused_prefetches"] += 1
                return None
            return self._start(layer, expert, *admitted, prefetch=prefetch)

    def wait(self, load: HostLoad, *, pin: bool = False, timeout: float | None = None) -> HostExpert:
        """Wait for `load`'s reads and return the expert's views; `pin=True` pins it in the same
        step, so no other load can evict it before the caller's `unpin`."""
        with load.lock:  # one thread collects the pager tickets; the others find it done
            if not load.done:
                self._collect(load, timeout)
        if load.error is not None:
            raise load.error
        with self._lock:
            slot = self.policy.lookup(self._index(load.layer), load.expert)
            if slot != load.slot or not self.policy.is_ready(slot):
                raise StrataError(f"host tier: expert {load.expert} of layer {load.layer} was evicted "
                                  f"from slot {load.slot} after its load; load it again (pin to keep it)")
            if pin:
                self.policy.pin(self._index(load.layer), load.expert)
            return self._view(load.layer, load.expert, slot)

    def reap(self, layer: int) -> int:
        """Complete every load in flight in `layer`'s slots, waiting for their reads. A load nobody
        waits for (a prefetch whose device slot was given back) would otherwise keep its slot
        LOADING for good, and a layer whose slots are all LOADING refuses every load. Returns how
        many loads it completed."""
        with self._lock:
            loads = [ld for ld in self._loading.values() if ld.layer == layer]
        n = 0
        for load in loads:
            with load.lock:
                if not load.done:
                    self._collect(load, None)
                    n += 1
        return n

    def acquire(self, layer: int, expert: int) -> HostExpert:
        """Load, wait and pin: the expert's bytes stay put until `unpin(layer, expert)`."""
        return self.wait(self.load(layer, expert), pin=True)

    # ---- resident experts ----------------------------------------------------------------------

    def lookup(self, layer: int, expert: int) -> int | None:
        """Slot holding or loading (layer, expert), or None."""
        with self._lock:
            return self.policy.lookup(self._index(layer), expert)

    def view(self, layer: int, expert: int) -> HostExpert:
        """Views of a loaded expert (valid while it stays resident: pin it)."""
        with self._lock:
            return self._view(layer, expert, self._ready_slot(layer, expert, "view"))

    def pin(self, layer: int, expert: int) -> HostExpert:
        """Hold a loaded expert in its slot (counted) and return its views."""
        with self._lock:
            slot = self._ready_slot(layer, expert, "pin")
            self.policy.pin(self._index(layer), expert)
            return self._view(layer, expert, slot)

    def pin_if_ready(self, layer: int, expert: int) -> HostExpert | None:
        """`pin` when (layer, expert) is loaded, else None (not resident, or still loading): one
        step, so no load can evict it in between."""
        with self._lock:
            slot = self.policy.lookup(self._index(layer), expert)
            if slot is None or self.policy.slot_state[slot] != READY:
                return None
            self.policy.pin(self._index(layer), expert)
            return self._view(layer, expert, slot)

    def pin_slot_if_ready(self, layer: int, expert: int) -> int | None:
        """`pin_if_ready` for a caller that computes from the pool (the paged memory): the slot,
        or None, without building views."""
        with self._lock:
            li = self._index(layer)
            slot = self.policy.lookup(li, expert)
            if slot is None or self.policy.slot_state[slot] != READY:
                return None
            self.policy.pin(li, expert)
            return slot

    def is_ready(self, layer: int, expert: int) -> bool:
        """True when (layer, expert) is loaded in a host slot (a hint: pin it to keep it)."""
        with self._lock:
            slot = self.policy.lookup(self._index(layer), expert)
            return slot is not None and self.policy.slot_state[slot] == READY

    def layer_parts(self, layer: int) -> native.MoeParts:
        """The pool as the native MoE kernels' regions for `layer` (compact mode only): slot s's
        part p starts at byte s * slot_bytes + part_offset[p], so `index` is the host slot."""
        return self._parts(layer)

    def _pool_parts(self, layer: int) -> native.MoeParts:
        if not self.compact:
            raise StrataError("host tier: slabs sit at their read offsets; only a compact tier (compact=True) "
                              "is read in place as strided regions")
        stride = self.layout.slot_bytes
        return native.MoeParts(*(native.MoePart(self.pool[self.layout.part_offset[p]:], slab.ggml_type, *slab.shape,
                                                stride=stride)
                                 for p, slab in enumerate(self.model.expert_slabs(layer, 0))))

    def unpin(self, layer: int, expert: int) -> None:
        with self._lock:
            self.policy.unpin(self._index(layer), expert)

    def record(self, layer: int, expert_ids: np.ndarray) -> None:
        """The router of `layer` chose `expert_ids` ([..., K]): feeds the policy's use counts."""
        with self._lock:
            self.policy.record(self._index(layer), expert_ids)

    def record_layers(self, layers: Sequence[int], expert_ids: np.ndarray) -> None:
        """`record` of several layers at once (expert_ids [len(layers), T, K])."""
        with self._lock:
            self.policy.record_layers(self.layers.indices(layers), expert_ids)

    def seed_counts(self, counts: np.ndarray, n_tokens: int) -> None:
        """Initial routing statistics for the policy (`ExpertPolicy.seed_counts`), [L, E]."""
        with self._lock:
            self.policy.seed_counts(counts, n_tokens)

    def hint(self, layer: int, expert_ids: np.ndarray, probs: np.ndarray | float = 1.0) -> None:
        """A predictor expects `expert_ids` at `layer`'s next step: protects them from eviction."""
        with self._lock:
            self.policy.hint(self._index(layer), expert_ids, probs)

    def stats(self) -> dict[str, Any]:
        """Hits, misses, prefetches, evictions and bytes loaded, with the pool and the pager's figures."""
        with self._lock:
            counters = dict(self.counters)
        return {**counters, "n_slots": self.n_slots, "slot_bytes": self.layout.slot_bytes,
                "pool_bytes": self.pool.nbytes, "pinned": self.pinned, "pager": self.pager.stats()}

    def close(self) -> None:
        """Stop the pager (reads in flight finish or are cancelled). The pool lives until dropped."""
        self.pager.close()

    def __enter__(self) -> HostTier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- internals (self._lock held unless said otherwise) --------------------------------------

    def _index(self, layer: int) -> int:
        return self.layers.index(layer)

    def _resident(self, layer: int, li: int, expert: int) -> HostLoad | None:
        slot = self.policy.lookup(li, expert)
        if slot is None:
            return None
        if self.policy.is_ready(slot):
            self.counters["hits"] += 1
            return HostLoad(layer, expert, slot, hit=True)
        return self._loading[slot]

    def _start(self, layer: int, expert: int, slot: int, evicted: int | None, prefetch: bool) -> HostLoad:
        load = HostLoad(layer, expert, slot, prefetch=prefetch)
        try:
            for p, part in enumerate(PARTS):
                slab = self.model.expert(layer, expert, part)
                load.tickets.append(self.pager.submit(slab.offset, slab.nbytes, self._region(slot, p)))
        except BaseException:
            for ticket in load.tickets:  # no read may still land in a slot handed back
                _collect_quietly(self.pager, ticket)
            self.policy.cancel(self._index(layer), expert)
            raise
        self._loading[slot] = load
        self.counters["prefetches" if prefetch else "misses"] += 1
        self.counters["evictions"] += evicted is not None
        return load

    def _collect(self, load: HostLoad, timeout: float | None) -> None:
        """Wait for the load's reads (load.lock held, self._lock not), then complete its slot, or
        cancel it when a read failed. A timeout (per read) leaves the load pending."""
        while len(load.offsets) < len(load.tickets):
            try:
                offset = self.pager.wait(load.tickets[len(load.offsets)], timeout)
            except native.PagerTimeoutError:
                raise
            except NativeError as exc:
                load.error, offset = load.error or exc, -1
            load.offsets.append(offset)
        if self.compact and load.error is None:
            self._move_to_region_starts(load)
        with self._lock:
            li = self._index(load.layer)
            self._loading.pop(load.slot, None)
            if load.error is None:
                self._finish(load, li)
            else:
                self.counters["failed_loads"] += 1
                self.policy.cancel(li, load.expert)
            load.done = True

    def _move_to_region_starts(self, load: HostLoad) -> None:
        """Compact mode (self._lock not held; the slot is LOADING, so nothing reads it): move each
        slab from `data_offset` to the start of its region. memmove: the ranges may overlap."""
        base = self.pool.ctypes.data + load.slot * self.layout.slot_bytes
        for p, part in enumerate(PARTS):
            if load.offsets[p]:
                start = base + self.layout.part_offset[p]
                ctypes.memmove(start, start + load.offsets[p], self.model.expert(load.layer, load.expert, part).nbytes)
                load.offsets[p] = 0

    def _finish(self, load: HostLoad, li: int) -> None:
        self._data_offset[load.slot] = load.offsets
        self.policy.complete(li, load.expert)
        self.counters["bytes_loaded"] += sum(self.model.expert(load.layer, load.expert, p).nbytes for p in PARTS)

    def _region(self, slot: int, part: int) -> np.ndarray:
        start = slot * self.layout.slot_bytes + self.layout.part_offset[part]
        return self.pool[start:start + self.layout.part_capacity[part]]

    def _ready_slot(self, layer: int, expert: int, what: str) -> int:
        slot = self.policy.lookup(self._index(layer), expert)
        if slot is None or self.policy.slot_state[slot] != READY:
            state = "not resident" if slot is None else "still loading (wait for its load first)"
            raise StrataError(f"host tier {what}: expert {expert} of layer {layer} is {state}")
        return slot

    def _view(self, layer: int, expert: int, slot: int) -> HostExpert:
        slabs = self.model.expert_slabs(layer, expert)
        parts = []
        for p, slab in enumerate(slabs):
            start = slot * self.layout.slot_bytes + self.layout.part_offset[p] + int(self._data_offset[slot, p])
            parts.append(self.pool[start:start + slab.nbytes])
        return HostExpert(layer, expert, slot, slabs, tuple(parts))


def _collect_quietly(pager: native.Pager, ticket: int) -> None:
    try:
        pager.wait(ticket)
    except NativeError:
        pass


__all__ = ["BudgetError", "HostExpert", "HostLoad", "HostTier", "SlotLayout", "slot_layout"]
