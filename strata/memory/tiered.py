"""`TieredExpertMemory`: routed experts in three tiers behind the `ExpertMemory` interface.

    memory = TieredExpertMemory(model_file, device="cuda", dtype=torch.bfloat16,
                                config=TieredConfig(device_mem="20G", host_mem="64G", prefetch_depth=2))

An `acquire(layer, expert_ids)` finds each expert in the first tier that holds it:

    device slot (page table hit)   free: a GEMM on the slot (packed form: dequantize, then GEMM)
    host slot (host tier hit)      fill a device slot from it (copy, or dequantize)
    the file (disk)                the pager reads it into a host slot, then as above

and pins the device slots until `release`. Which expert occupies which slot is decided by an
`ExpertPolicy` per tier (decayed use counts, hints, pins, loads in flight; `policy.py`); the
page table `(layer, expert) -> slot` is the device policy's int32 [L, E] array (the host
mirror) and `page_table`, its copy on the device (the same memory on the CPU), for kernels that
index slots on the device. Every buffer is allocated in the constructor: the device slots and
scratch (`device.py`), the host pool (`host.py`), the page table; decoding only changes which
expert each slot holds (`alloc.ALLOCATIONS` counts every buffer, for the tests).

Prefetch. `prefetch(layer, expert_ids, probs)` (called by the model's look-ahead: the next
layers' routers applied to the current hidden state) and the co-occurrence predictor (fed by
`observe`, the routing of each layer) announce experts of the next layers. The device policy
admits a prediction only where it displaces less (`admit_prefetch`); admitted loads queue for
one loader thread, which reads through the host tier (the pager's native threads do the disk
reads) and fills the slot (native dequantization releases the GIL; on CUDA the copy and
dequantization are queued on the load stream and the compute stream waits on that slot's event
only). A load the compute reaches before the loader does is taken over by the compute thread;
a prediction that is wrong has cost a load, never a result: slots are filled only with the
file's bytes, and compute reads a slot only after its load.

Initial placement. When the file carries routing statistics (`ModelFile.routing_counts()`, the
`strata.routing.*` metadata), both tiers' policies are seeded with them and each layer's hottest
experts are loaded into its device slots (and host slots) in the constructor, before decoding:
counted as `startup_loads`, not as misses. Without them the slots start empty and the policies'
decayed counts warm up from the first tokens' routing.

Layers here are model layer numbers; the policies and statistics index expert layers 0..L-1.
"""
from __future__ import annotations

import queue
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from strata import native
from strata.errors import StrataError
from strata.gguf import ModelFile

from . import alloc
from .base import ExpertMemory, ExpertWeights
from .budget import DEFAULT_PREFETCH_DEPTH, Plan, make_plan
from .device import DeviceSlots, expert_geometry
from .host import HostLoad, HostTier
from .policy import LOADING, ExpertPolicy, PolicyConfig, PoolExhaustedError
from .predictor import CooccurrencePredictor
from .stats import MemoryStats

# Who is loading a LOADING slot (job state per slot).
_NONE, _QUEUED, _LOADER, _COMPUTE = 0, 1, 2, 3
_RETRY_S = 2e-4  # pause before retrying when every host slot of a layer is pinned by loads in flight


@dataclass(frozen=True)
class TieredConfig:
    """Budgets and prefetch settings; None means the machine's default (see `budget.py`).

    device_mem, host_mem: bytes (int) or sizes such as '512M', '8G'.
    slot_form: 'dequantized' or 'packed' (None: the device's default).
    prefetch_depth: layers ahead to predict and load while a layer computes; 0 turns prefetch off
        (None: DEFAULT_PREFETCH_DEPTH of the device).
    cooccurrence: add the cross-layer co-occurrence predictor to the router look-ahead; its
        predictions below `cooccurrence_min_prob` are not loaded, nor any before it has seen
        `cooccurrence_min_tokens` tokens (naive Bayes on a few counts is overconfident).
    prefetch_margin: the policies' margin (`PolicyConfig.prefetch_margin`): a prediction of
        probability p displaces only experts whose keep value is below p / margin.
    pager_threads, direct: the host tier's pager (threads; O_DIRECT: None = where possible).
    """

    device_mem: int | str | None = None
    host_mem: int | str | None = None
    slot_form: str | None = None
    prefetch_depth: int | None = None
    cooccurrence: bool = True
    cooccurrence_min_prob: float = 0.5
    cooccurrence_min_tokens: int = 256
    prefetch_margin: float = 2.0
    pager_threads: int = 4
    direct: bool | None = None

    def __post_init__(self) -> None:
        d = self.prefetch_depth
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 0):
            raise StrataError(f"prefetch depth must be a whole number >= 0 (0: off), found {self.prefetch_depth!r}")
        if not self.prefetch_margin > 0:
            raise StrataError(f"prefetch margin must be positive, found {self.prefetch_margin!r}")


class TieredExpertMemory(ExpertMemory):
    """Experts in device slots, host slots and the file; see the module docstring.

    reserved_bytes: device memory the rest of the model takes (resident weights, KV cache),
        subtracted from the device budget before slots are carved from it.
    """

    def __init__(self, model_file: ModelFile, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, n_threads: int | None = None,
                 config: TieredConfig | None = None, reserved_bytes: int = 0):
        if not model_file.expert_layers:
            raise ValueError(f"{model_file.path}: the model has no routed experts")
        self.model_file, self.config = model_file, config or TieredConfig()
        self.device, self.dtype = _indexed(torch.device(device)), dtype
        self.n_threads = n_threads or native.default_threads()
        hp = model_file.hparams
        self.layers = list(model_file.expert_layers)
        self._index = {layer: i for i, layer in enumerate(self.layers)}
        self.top_k, self.n_experts = hp.n_experts_used, hp.n_experts
        self.geometry = expert_geometry(model_file)
        self.plan: Plan = make_plan(model_file, self.geometry, self.device, dtype, device_mem=self.config.device_mem,
                                    host_mem=self.config.host_mem, slot_form=self.config.slot_form,
                                    reserved=reserved_bytes)
        self.max_acquire = self.plan.max_acquire
        depth = self.config.prefetch_depth
        self.prefetch_depth = DEFAULT_PREFETCH_DEPTH.get(self.device.type, 1) if depth is None else depth
        policy_config = PolicyConfig(prefetch_margin=self.config.prefetch_margin)
        L, E = len(self.layers), self.n_experts
        self.policy = ExpertPolicy(L, E, self.plan.slots_per_layer, self.top_k, policy_config)
        self.host = HostTier(model_file, self.plan.host_budget, top_k=self.top_k, device=str(self.device),
                             n_threads=self.config.pager_threads, direct=self.config.direct,
                             policy_config=policy_config)
        try:
            self.slots = DeviceSlots(self.geometry, self.policy.n_slots, self.plan.form, self.device, dtype,
                                     n_scratch=self.max_acquire, n_threads=self.n_threads)
            self.page_table = self._device_page_table()  # int32 [L, E] on the device
        except BaseException:
            self.host.close()
            raise
        self.stats = MemoryStats(self.layers, E)
        self.predictor = (CooccurrencePredictor(L, E, self.top_k, max_batch=64)
                          if self.config.cooccurrence and self.prefetch_depth > 0 and L > 1 else None)
        S = self.policy.n_slots
        self._lock = threading.Lock()
        self._ready = [threading.Event() for _ in range(S)]  # set when the slot's load is over
        for event in self._ready:
            event.set()
        self._job = np.zeros(S, dtype=np.int8)  # [S] who loads a LOADING slot
        self._generation = np.zeros(S, dtype=np.int64)  # [S] admissions so far: stale queue entries
        self._prefetched = np.zeros(S, dtype=bool)  # [S] filled by a prefetch not yet used
        self._error: list[BaseException | None] = [None] * S
        self._table_dirty = np.zeros(L, dtype=bool)  # [L] device page table rows behind the mirror
        self._predicted = np.zeros((L, E), dtype=bool)  # [L, E] announced for the layer's next step
        self._unpins: deque[tuple[int, int, int]] = deque()  # (slot, layer, expert): CUDA host pins to drop
        self._unpin_lock = threading.Lock()
        self._held: tuple[int, tuple[int, ...], list[int]] | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._loader: threading.Thread | None = None
        try:
            self._place_initial()  # before the loader thread starts: nothing else moves slots
        except BaseException:
            self.host.close()
            raise
        if self.prefetch_depth > 0:  # the thread holds the memory weakly: dropping it stops the thread
            self._loader = threading.Thread(target=_loader_main, args=(weakref.ref(self), self._queue),
                                            name="strata-expert-loader", daemon=True)
            self._loader.start()
            weakref.finalize(self, self._queue.put, None)

    def __repr__(self) -> str:
        p = self.plan
        return (f"TieredExpertMemory({self.model_file.path.name}, {self.device}, {p.form} slots: "
                f"{p.slots_per_layer}/{self.n_experts} per layer on the device, "
                f"{self.host.slots_per_layer}/{self.n_experts} in the host tier, prefetch depth {self.prefetch_depth})")

    def _device_page_table(self) -> torch.Tensor:
        if self.device.type == "cpu":
            return torch.from_numpy(self.policy.page_table)  # the mirror itself
        shape = tuple(self.policy.page_table.shape)
        # rows go up through a pinned copy of the mirror, so updating one never stalls compute
        self._table_staging = alloc.empty(shape, torch.int32, "cpu", "page table staging", pin=True)
        self._table_events = [torch.cuda.Event() for _ in range(shape[0])]
        table = alloc.empty(shape, torch.int32, self.device, "page table")
        table.fill_(-1)
        return table

    # ---- the ExpertMemory protocol -------------------------------------------------------------

    def acquire(self, layer: int, expert_ids: Sequence[int]) -> list[ExpertWeights]:
        ids = tuple(int(e) for e in expert_ids)
        li = self._layer(layer)
        if self._held is not None:
            raise RuntimeError(f"acquire(layer={layer}) while layer {self._held[0]} experts {list(self._held[1])} "
                               "are still held: release them first")
        if len(ids) > self.max_acquire or len(set(ids)) != len(ids):
            raise ValueError(f"acquire of {list(ids)}: at most max_acquire={self.max_acquire} distinct experts at once")
        t0 = time.perf_counter()
        self._drain_unpins()
        slots: list[int] = []
        try:
            demand, late = self._reserve(layer, li, ids, slots)
            self._load(layer, li, demand)
            self._wait(li, late)
            self._wait_copies(slots)
        except BaseException:
            self._abort(li, ids[:len(slots)], slots)
            raise
        self.stats.wait_s[li] += time.perf_counter() - t0
        self._held = (layer, ids, slots)
        self._sync_page_table(li)
        return [self._weights(layer, li, e, slot, i) for i, (e, slot) in enumerate(zip(ids, slots))]

    def release(self, layer: int, expert_ids: Sequence[int]) -> None:
        ids = tuple(int(e) for e in expert_ids)
        if self._held is None or self._held[:2] != (layer, ids):
            held = None if self._held is None else self._held[:2]
            raise RuntimeError(f"release(layer={layer}, {list(ids)}) does not match what is held: {held}")
        li, slots = self._layer(layer), self._held[2]
        with self._lock:
            for e, slot in zip(ids, slots):
                self.slots.release(slot)
                self.policy.unpin(li, e)
        self._held = None

    def observe(self, layer: int, expert_ids: torch.Tensor) -> None:
        """The router of `layer` chose `expert_ids` [T, K]: use counts for both tiers, prediction
        scores, and the co-occurrence predictor's evidence (and its predictions)."""
        li = self._layer(layer)
        ids = expert_ids.detach().to("cpu", torch.int64).numpy()  # [T, K]
        with self._lock:
            self.policy.record(li, ids)
            self.stats.record_routing(li, ids)
            self._score_predictions(li, ids)
        self.host.record(layer, ids)
        if self.predictor is not None and ids.shape[0] <= self.predictor.max_batch:
            self.predictor.observe(li, ids)
            self._prefetch_cooccurring(li, ids)

    def prefetch(self, layer: int, expert_ids: Sequence[int], probs: Sequence[float] | None = None) -> None:
        """Start loading `expert_ids` of `layer` (needed with probability `probs`, default 1)
        where the policy finds room; returns at once. Ignored when prefetch is off."""
        if self.prefetch_depth == 0:
            return
        li = self._layer(layer)
        ids = np.asarray(expert_ids, dtype=np.int64).ravel()  # [n]
        p = np.ones(ids.shape) if probs is None else np.asarray(probs, dtype=np.float64).ravel()  # [n]
        self.host.hint(layer, ids, p)
        with self._lock:
            self._predicted[li, ids] = True
            self.policy.hint(li, ids, p)
            for e, pe in zip(ids.tolist(), p.tolist()):
                if self.policy.lookup(li, e) is None:
                    self._admit_prefetch(layer, li, e, pe)

    def close(self) -> None:
        if self._loader is not None:
            self._queue.put(None)
            self._loader.join()
            self._loader = None
        self._drain_unpins(block=True)
        self.host.close()

    def memory_stats(self) -> MemoryStats:
        return self.stats

    # ---- start-up ------------------------------------------------------------------------------

    def _place_initial(self) -> None:
        """Seed both policies from the file's routing statistics and load each layer's hottest
        experts into the host, then the device slots; a no-op when the file has none."""
        routing = self.model_file.routing_counts()  # ([L, E], n_tokens) or None
        if routing is None:
            return
        self.policy.seed_counts(*routing)
        self.host.seed_counts(*routing)
        for li, e in self.host.policy.initial_placement():
            self.host.wait(self._host_load(self.layers[li], e))
        for li, e in self.policy.initial_placement():
            layer = self.layers[li]
            with self._lock:
                slot, _ = self.policy.admit(li, e)
                self._start_load(slot, _COMPUTE)
            self._fill(layer, li, e, slot, self._host_wait(layer, e, self._host_load(layer, e)))
            self.stats.startup_loads[li] += 1
        placed = self.stats.startup_loads.copy()
        self.stats.reset()  # start-up loads are not decode traffic
        self.stats.startup_loads[:] = placed

    def _host_load(self, layer: int, e: int) -> HostLoad:
        """A host load at start-up; host slots still pinned by device copies (CUDA) are let go
        when the layer's pool is full."""
        try:
            return self.host.load(layer, e)
        except PoolExhaustedError:
            self._drain_unpins(block=True)
            return self.host.load(layer, e)

    # ---- acquire, step by step -----------------------------------------------------------------

    def _reserve(self, layer: int, li: int, ids: tuple[int, ...], slots: list[int]) -> tuple[list, list]:
        """Pin a device slot for every expert (appended to `slots`): hits as they are, loads in
        flight to wait for (`late`: (expert, slot)), others admitted for a demand load or taken
        over from the loader's queue (`demand`: (expert, slot, taken over))."""
        demand, late = [], []
        for e in ids:
            while True:
                with self._lock:
                    slot = self.policy.lookup(li, e)
                    if slot is not None:
                        self._pin_resident(li, e, slot, demand, late)
                        break
                    try:
                        slot, evicted = self.policy.admit(li, e)
                    except PoolExhaustedError:
                        busy = self._free_a_slot(li)  # every unpinned slot is loading a prefetch
                    else:
                        self._start_load(slot, _COMPUTE)
                        self.policy.pin(li, e)
                        self.stats.device_misses[li] += 1
                        self.stats.evictions[li] += evicted is not None
                        demand.append((e, slot, False))
                        break
                if busy is not None:
                    self._ready[busy].wait()
            slots.append(slot)
        self.stats.requests[li] += len(ids)
        return demand, late

    def _pin_resident(self, li: int, e: int, slot: int, demand: list, late: list) -> None:
        self.policy.pin(li, e)
        if self._prefetched[slot]:
            self.stats.prefetch_used[li] += 1
            self._prefetched[slot] = False
        if self.policy.is_ready(slot):
            self.stats.device_hits[li] += 1
            return
        self.stats.device_late[li] += 1
        if self._job[slot] == _QUEUED:  # the loader has not started it: load it here, now
            self._job[slot] = _COMPUTE
            self.stats.prefetch_used[li] += 1
            demand.append((e, slot, True))
        else:
            late.append((e, slot))

    def _free_a_slot(self, li: int) -> int | None:
        """Every unpinned slot of the layer is loading: cancel one the loader has not started
        (returns None), else return one the loader is loading, to wait for."""
        lo, hi = int(self.policy.first_slot[li]), int(self.policy.first_slot[li + 1])
        busy = None
        for slot in range(lo, hi):
            if self.policy.slot_state[slot] == LOADING and self.policy.slot_pins[slot] == 0:
                if self._job[slot] == _QUEUED:
                    self._cancel(li, slot)
                    self.stats.prefetch_cancelled[li] += 1
                    return None
                busy = slot
        if busy is None:
            raise PoolExhaustedError(f"layer {self.layers[li]}: all {hi - lo} device slots are pinned; "
                                     f"acquire at most max_acquire={self.max_acquire} experts at once")
        return busy

    def _load(self, layer: int, li: int, demand: list[tuple[int, int, bool]]) -> None:
        """Loads compute does itself (misses, and prefetches taken over from the queue): every
        host read queued first (so the pager overlaps them), then each expert's device slot
        filled as its bytes arrive."""
        pending: deque[tuple[int, int, HostLoad]] = deque()
        for e, slot, taken_over in demand:
            while True:
                try:
                    load = self.host.load(layer, e)
                    break
                except PoolExhaustedError:  # host slots of the layer all loading or pinned
                    if pending:
                        self._fill_demand(layer, li, *pending.popleft())
                    else:
                        self._drain_unpins()
                        time.sleep(_RETRY_S)
            self._count_host(li, layer, e, load, prefetch=taken_over)
            pending.append((e, slot, load))
        while pending:
            self._fill_demand(layer, li, *pending.popleft())

    def _fill_demand(self, layer: int, li: int, e: int, slot: int, load: HostLoad) -> None:
        expert = self._host_wait(layer, e, load)
        self._fill(layer, li, e, slot, expert)

    def _wait(self, li: int, late: list[tuple[int, int]]) -> None:
        """Wait for the loader to finish the prefetches compute needs."""
        for e, slot in late:
            self._ready[slot].wait()
            error = self._error[slot]
            if error is not None:
                raise StrataError(f"loading expert {e} of layer {self.layers[li]} failed: {error}") from error

    def _wait_copies(self, slots: list[int]) -> None:
        """CUDA: block until the copies into these slots are done. The model syncs with the host
        at every layer anyway (routing is read back), so this costs no overlap, and it makes
        `wait_s` the time compute really waited for experts, as on the CPU."""
        for slot in slots:
            if not self.slots.fill_done(slot):
                self.slots.sync_fill(slot)

    def _weights(self, layer: int, li: int, e: int, slot: int, index: int) -> ExpertWeights:
        self.slots.wait_ready(slot)
        weights, seconds = self.slots.weights(slot, self.model_file.expert_slabs(layer, e), index)
        if seconds:
            with self._lock:
                self.stats.dequant_s[li] += seconds
        return weights

    def _abort(self, li: int, ids: Sequence[int], slots: Sequence[int]) -> None:
        """Undo a failed acquire: unpin its slots; cancel the loads it owned or that failed."""
        with self._lock:
            for e, slot in zip(ids, slots):
                self.policy.unpin(li, e)
                owned = self._job[slot] == _COMPUTE or self._error[slot] is not None
                if self.policy.slot_state[slot] == LOADING and owned and self.policy.slot_pins[slot] == 0:
                    self._cancel(li, slot)

    # ---- loads (any thread) --------------------------------------------------------------------

    def _start_load(self, slot: int, who: int) -> None:
        """A slot was just admitted (lock held): it is loading, by `who`."""
        self._generation[slot] += 1
        self._job[slot] = who
        self._prefetched[slot] = False
        self._error[slot] = None
        self._ready[slot].clear()

    def _cancel(self, li: int, slot: int) -> None:
        """Give a LOADING slot back to the policy (lock held)."""
        self.policy.cancel(li, int(self.policy.slot_expert[slot]))
        self._job[slot] = _NONE
        self._table_dirty[li] = True
        self._ready[slot].set()

    def _host_wait(self, layer: int, e: int, load: HostLoad):
        """The expert's bytes in a pinned host slot, once `load` is done. A slot evicted between
        its load and this pin (by another thread's load) is loaded again."""
        while True:
            try:
                return self.host.wait(load, pin=True)
            except StrataError:
                if load.error is not None or not load.done:
                    raise
            load = self.host.load(layer, e)

    def _fill(self, layer: int, li: int, e: int, slot: int, expert, prefetched: bool = False) -> None:
        """Host slot -> device slot, then READY; the host slot is unpinned once the copy is done."""
        try:
            seconds, written = self.slots.fill(slot, expert.slabs, expert.parts)
        except BaseException:
            self.host.unpin(layer, e)
            raise
        if self.slots.cuda:
            with self._unpin_lock:
                self._unpins.append((slot, layer, e))
        else:
            self.host.unpin(layer, e)
        with self._lock:
            self.stats.dequant_s[li] += seconds
            self.stats.bytes_to_device[li] += written
            self.policy.complete(li, e)
            self._job[slot] = _NONE
            self._prefetched[slot] = prefetched
            self._table_dirty[li] = True
            self._ready[slot].set()

    def _count_host(self, li: int, layer: int, e: int, load: HostLoad, prefetch: bool) -> None:
        hits, reads = ((self.stats.prefetch_host_hits, self.stats.prefetch_disk_reads) if prefetch
                       else (self.stats.host_hits, self.stats.disk_reads))
        nbytes = 0 if load.hit else sum(s.nbytes for s in self.model_file.expert_slabs(layer, e))
        with self._lock:
            if load.hit:
                hits[li] += 1
            else:
                reads[li] += 1
                self.stats.bytes_disk[li] += nbytes

    def _drain_unpins(self, block: bool = False) -> None:
        """Unpin host slots whose copies to the device have finished (CUDA)."""
        while True:
            with self._unpin_lock:
                if not self._unpins:
                    return
                slot, layer, e = self._unpins[0]
                if not (block or self.slots.fill_done(slot)):
                    return
                self._unpins.popleft()
            self.slots.sync_fill(slot)
            self.host.unpin(layer, e)

    def _sync_page_table(self, li: int) -> None:
        """Bring the device page table's row up to date with the mirror (CUDA; the CPU shares it)."""
        if self.device.type == "cpu" or not self._table_dirty[li]:
            return
        self._table_events[li].synchronize()  # the row's last upload has left the staging row
        with self._lock:
            self._table_staging[li].numpy()[:] = self.policy.page_table[li]
            self._table_dirty[li] = False
        self.page_table[li].copy_(self._table_staging[li], non_blocking=True)
        self._table_events[li].record(torch.cuda.current_stream(self.device))

    # ---- prefetch ------------------------------------------------------------------------------

    def _admit_prefetch(self, layer: int, li: int, e: int, prob: float) -> None:
        """Lock held: a device slot for a predicted expert, if the policy gives one; queue its load."""
        admitted = self.policy.admit_prefetch(li, e, prob)
        if admitted is None:
            self.stats.prefetch_refused[li] += 1
            return
        slot, evicted = admitted
        self._start_load(slot, _QUEUED)
        self._table_dirty[li] = True
        self.stats.prefetch_issued[li] += 1
        self.stats.evictions[li] += evicted is not None
        self._queue.put((layer, li, e, slot, int(self._generation[slot]), prob))

    def _prefetch_cooccurring(self, li: int, ids: np.ndarray) -> None:
        """Predict the next layers from this layer's routing [T, K] and prefetch the likely ones."""
        if li + 1 >= len(self.layers) or self.predictor.n[li] < self.config.cooccurrence_min_tokens:
            return
        best: dict[int, dict[int, float]] = {}
        for token_ids in ids:
            for nxt, experts, probs in self.predictor.predict(li, token_ids, self.prefetch_depth):
                row = best.setdefault(nxt, {})
                for e, p in zip(experts.tolist(), probs.tolist()):
                    if p >= self.config.cooccurrence_min_prob and p > row.get(e, 0.0):
                        row[e] = p
        for nxt, row in best.items():
            if row:
                self.prefetch(self.layers[nxt], list(row), list(row.values()))

    def _score_predictions(self, li: int, ids: np.ndarray) -> None:
        """Lock held: compare the experts announced for this step with those routed."""
        predicted = self._predicted[li]
        if not predicted.any():
            return
        actual = np.unique(ids)
        self.stats.predicted[li] += int(predicted.sum())
        self.stats.actual[li] += actual.size
        self.stats.predicted_correct[li] += int(predicted[actual].sum())
        predicted[:] = False

    def _run_prefetch(self, layer: int, li: int, e: int, slot: int, generation: int, prob: float) -> None:
        with self._lock:
            if self._generation[slot] != generation or self._job[slot] != _QUEUED:
                return  # cancelled, or taken over by compute
            self._job[slot] = _LOADER
        try:
            expert = self._prefetch_host(layer, li, e, slot, prob)
            if expert is not None:
                self._fill(layer, li, e, slot, expert, prefetched=True)
        except BaseException as exc:  # compute may be waiting for this slot: hand it the error
            with self._lock:
                self._error[slot] = exc
                if self.policy.slot_pins[slot] == 0:
                    self._cancel(li, slot)
                self._ready[slot].set()

    def _prefetch_host(self, layer: int, li: int, e: int, slot: int, prob: float):
        """The predicted expert in a pinned host slot, or None when the host tier refuses it and
        compute is not waiting for it (the device slot is then given back)."""
        while True:
            try:
                load = self.host.prefetch(layer, e, prob)
            except PoolExhaustedError:
                load = None
            if load is None:
                with self._lock:
                    if self.policy.slot_pins[slot] == 0:
                        self._cancel(li, slot)
                        self.stats.prefetch_cancelled[li] += 1
                        return None
                try:  # compute is waiting for it: load it as a demand load would
                    load = self.host.load(layer, e)
                except PoolExhaustedError:
                    self._drain_unpins()
                    time.sleep(_RETRY_S)
                    continue
            self._count_host(li, layer, e, load, prefetch=True)
            return self._host_wait(layer, e, load)

    def _layer(self, layer: int) -> int:
        li = self._index.get(layer)
        if li is None:
            raise ValueError(f"layer {layer} has no routed experts in {self.model_file.path} "
                             f"(expert layers: {self.layers})")
        return li


def _loader_main(memory_ref: weakref.ref, jobs: queue.SimpleQueue) -> None:
    """The loader thread: runs queued prefetches until None arrives or the memory is gone. It
    holds the memory only while it works, so an unclosed memory can still be collected."""
    memory = memory_ref()
    if memory is None:
        return
    if memory.slots.cuda:
        torch.cuda.set_device(memory.device.index)
    while True:
        timeout = 0.01 if memory._unpins else None  # host pins wait for copies to finish (CUDA)
        del memory
        try:
            job = jobs.get(timeout=timeout)
        except queue.Empty:
            job = ()
        memory = memory_ref()
        if job is None or memory is None:
            return
        memory._drain_unpins()
        if job:
            memory._run_prefetch(*job)


def _indexed(device: torch.device) -> torch.device:
    """'cuda' as 'cuda:N' (the current device): threads other than the caller's need the index."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


__all__ = ["TieredConfig", "TieredExpertMemory"]
