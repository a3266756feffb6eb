"""`TieredExpertMemory`: routed experts in three tiers behind the `ExpertMemory` interface.

    memory = TieredExpertMemory(model_file, device="cuda", dtype=torch.bfloat16,
                                config=TieredConfig(device_mem="20G", host_mem="64G", prefetch_depth=2))

A `start(layer, expert_ids)` finds each expert in the first tier that holds it:

    device slot (page table hit)   free: a GEMM on the slot (packed form: dequantize, then GEMM)
    host slot (host tier hit)      fill a device slot from it (copy, or dequantize)
    the file (disk)                the pager reads it into a host slot, then as above

and pins the device slots until `release`. Which expert occupies which slot is decided by an
`ExpertPolicy` per tier (decayed use counts, hints, pins, loads in flight; `policy.py`); the
page table `(layer, expert) -> slot` is the device policy's int32 [L, E] array (nothing on the
device indexes slots, so it has no device copy). Every buffer is allocated in the constructor:
the device slots and scratch (`device.py`), the host pool (`host.py`); decoding only changes
which expert each slot holds (`alloc.ALLOCATIONS` counts every buffer, for the tests).

It hands out float weights (dequantized slots, or packed slots dequantized at each use), on
CUDA or the CPU. Packed compute on the CPU is the paged memory's (`paged.py`: there both tiers
would be RAM, and `strata.load(memory="tiered")` builds that one).

Hybrid (`TieredConfig.hybrid`): the host tier runs compact and the memory's `hybrid` lets the
runtime's CPU side (`strata.runtime.hybrid`) compute missed experts it holds in place; the rest
are acquired as above. With prefetch (depth > 0) the memory is its own `prefetcher`. This file is
the acquire path. Loads, their lock and the prefetch loader are `loads.py`'s (`SlotLoads`, which
the memory owns as `loads`), start-up placement `strata.memory.startup`'s, budgets and settings `budget.py`'s, predictors `predict/`'s. Layers
here are model layer numbers; the policies, predictors and statistics index expert layers
0..L-1 (`ExpertLayers` maps them). Must not: decide placement (the policies do).
"""
from __future__ import annotations

import bisect
import time
from collections import deque
from typing import Any, Sequence

import numpy as np
import torch

from strata import native
from strata.errors import StrataError
from strata.gguf import ModelFile

from ..base import ExpertLayers, ExpertMemory, ExpertWeights, HybridHost, Prefetcher, check_acquire
from ..budget import Plan, TieredConfig, make_plan
from ..device import DeviceSlots, expert_geometry
from ..host import HostLoad, HostTier
from ..machine import Machine
from .loads import COMPUTE, QUEUED, SlotLoads
from ..placement import estimate, warn_if_slow
from ..policy import LOADING, ExpertPolicy, PolicyConfig, PoolExhaustedError
from ..predict import LOOK_AHEAD, Cooccurrence, CooccurrencePredictor, Predictor, announcement
from ..predict.correction import LookaheadCorrection
from ..startup import place_initial
from ..stats import MemoryStats, Residency


class TieredExpertMemory(ExpertMemory, Prefetcher):
    """Experts in device slots, host slots and the file; see the module docstring.

    reserved_bytes: device memory the rest of the model takes (resident weights, KV cache),
        subtracted from the device budget before slots are carved from it.
    machine: the machine's memory the default budgets come from (`Machine`; `strata.load`
        measures it once; default: measured here).
    """

    kind = "tiered"

    def __init__(self, model_file: ModelFile, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, n_threads: int | None = None,
                 config: TieredConfig | None = None, reserved_bytes: int = 0, machine: Machine | None = None):
        if not model_file.expert_layers:
            raise ValueError(f"{model_file.path}: the model has no routed experts")
        self.model_file, self.config = model_file, config or TieredConfig()
        self.device, self.dtype = _indexed(torch.device(device)), dtype
        self.n_threads = n_threads or native.default_threads()
        hp = model_file.hparams
        self.layers = ExpertLayers(model_file.expert_layers, model_file.path)
        self.top_k, self.n_experts = hp.n_experts_used, hp.n_experts
        self.geometry = expert_geometry(model_file)
        machine = machine or Machine.measure(self.device)
        self.plan: Plan = make_plan(model_file, self.geometry, self.device, dtype, machine=machine,
                                    device_mem=self.config.device_mem, host_mem=self.config.host_mem,
                                    slot_form=self.config.slot_form, reserved=reserved_bytes)
        self.max_acquire = self.plan.max_acquire
        self.prefetch_depth = self.config.depth_for(self.device, self.plan.slots_per_layer == hp.n_experts)
        policy_config = PolicyConfig(prefetch_margin=self.config.prefetch_margin)
        L, E = len(self.layers), self.n_experts
        self.policy = ExpertPolicy(L, E, self.plan.slots_per_layer, self.top_k, policy_config)
        self.host = self.disk_tier = HostTier(model_file, self.plan.host_budget, top_k=self.top_k, device=str(self.device),
                             n_threads=self.config.pager_threads, direct=self.config.direct,
                             policy_config=policy_config, compact=self.config.hybrid, machine=machine)
        try:
            self.slots = DeviceSlots(self.geometry, self.policy.n_slots, self.plan.form, self.device, dtype,
                                     n_scratch=self.max_acquire,
                                     n_threads=self.n_threads)
            self.cuda_slots = self.slots.cuda
        except BaseException:
            self.host.close()
            raise
        self.placement = estimate(model_file, self.plan.slots_per_layer, self.host.slots_per_layer)
        warn_if_slow(model_file, self.placement)  # once, at start: most experts would come from the disk
        self.stats = MemoryStats(self.layers.layers, E)
        self._host_copies = [0, 0.0]  # hybrid: demand-loaded experts that were host hits only, their seconds
        self.predictors: list[Predictor] = []
        if self.config.cooccurrence and self.prefetch_depth > 0 and L > 1:
            self.predictors.append(Cooccurrence(CooccurrencePredictor(L, E, self.top_k, max_batch=64),
                                                self.prefetch_depth, min_prob=self.config.cooccurrence_min_prob,
                                                min_tokens=self.config.cooccurrence_min_tokens))
        self.lookahead_correction = (LookaheadCorrection(E, self.top_k) if self.config.predictor == "corrected"
                                     and self.prefetch_depth > 0 else None)  # the model's look-ahead reads it
        self.loads = SlotLoads(self.policy, self.host, self.slots, self.stats, self.layers, model_file, self.predictors,
                               self.config.prefetch_read_cost)
        self.hybrid = self._hybrid_host() if self.config.hybrid else None
        self._held: tuple[int, tuple[int, ...], list[int], bool] | None = None  # layer, experts, slots, pinned
        # Settled: the device has a slot for every expert and no loader thread or hybrid split moves
        # them, so a loaded expert stays where it is: a step's hits need no pins and the eviction
        # policy's use counts are never read (the common in-RAM case on the CPU).
        self._settled = (self.plan.slots_per_layer == E and self.prefetch_depth == 0 and not self.config.hybrid)
        try:
            # before the loader thread starts: nothing else moves slots
            place_initial(model_file, self.host, self.layers, self.stats, device=self.policy,
                          fill=self._place_on_device, host_load=self._startup_host_load)
        except BaseException:
            self.host.close()
            raise
        if self.prefetch_depth > 0:
            self.loads.start_thread()

    def __repr__(self) -> str:
        p = self.plan
        return (f"TieredExpertMemory({self.model_file.path.name}, {self.device}, {p.form} slots: "
                f"{p.slots_per_layer}/{self.n_experts} per layer on the device, "
                f"{self.host.slots_per_layer}/{self.n_experts} in the host tier, prefetch depth {self.prefetch_depth})")

    @property
    def prefetcher(self) -> Prefetcher | None:
        return self if self.prefetch_depth > 0 else None  # a property: the memory keeps no reference to itself

    @property
    def page_table(self) -> torch.Tensor:
        """The page table, int32 [L, E]: slot of (expert layer, expert), -1 when not resident (a
        view of the device policy's array, on the CPU)."""
        return torch.from_numpy(self.policy.page_table)

    @property
    def predictor(self) -> CooccurrencePredictor | None:
        """The co-occurrence table, when that predictor runs."""
        return next((p.table for p in self.predictors if isinstance(p, Cooccurrence)), None)

    # ---- the ExpertMemory protocol -------------------------------------------------------------

    def start(self, layer: int, expert_ids: Sequence[int]) -> list[ExpertWeights]:
        li, ids, slots = self._acquire_slots(layer, expert_ids)
        return [self._weights(layer, li, e, slot, i) for i, (e, slot) in enumerate(zip(ids, slots))]

    def _hybrid_host(self) -> HybridHost:
        """Hybrid only: the compact host tier and what the CPU side reads of this memory (its
        parts, not the memory itself: the record it keeps makes no reference cycle)."""
        lock, policy, layers, copies = self.loads.lock, self.policy, self.layers, self._host_copies

        def on_device(layer: int, e: int) -> bool:
            with lock:
                return policy.lookup(layers.index(layer), e) is not None

        return HybridHost(self.host, layers, self.stats, lock, on_device, lambda: (copies[0], copies[1]))

    def _acquire_slots(self, layer: int, expert_ids: Sequence[int]) -> tuple[int, tuple[int, ...], list[int]]:
        """Pin a device slot holding each expert (loading what is missing); (li, ids, slots)."""
        ids = tuple(int(e) for e in expert_ids)
        li = self._layer(layer)
        check_acquire(self._held, layer, ids, self.max_acquire)
        t0 = time.perf_counter()
        self.loads.drain_unpins()
        with self.loads.lock:  # the common step once the working set is resident: every expert ready
            # settled (every expert has its own slot and nothing moves them): hits need no pins
            pinned = not self._settled
            ready = self.policy.pin_ready(li, ids) if pinned else self.policy.ready_slots(li, ids)
            if ready is not None:
                if pinned and self.loads.prefetched[ready].any():
                    self.stats.prefetch_used[li] += int(self.loads.prefetched[ready].sum())
                    self.loads.prefetched[ready] = False
                self.stats.device_hits[li] += len(ids)
                self.stats.requests[li] += len(ids)
        if ready is not None:
            slots = ready.tolist()
            self._wait_copies(slots)
            self.stats.wait_s[li] += time.perf_counter() - t0
            self._held = (layer, ids, slots, pinned)
            return li, ids, slots
        slots: list[int | None] = [None] * len(ids)
        try:
            demand, late = self._reserve(layer, li, ids, slots)
            t_load, disk_reads = time.perf_counter(), self._disk_reads(li)
            self._load(layer, li, demand)
            self._wait(li, late)
            self._wait_copies(slots)
            if self.config.hybrid and demand and not late and self._disk_reads(li) == disk_reads:
                # every demand load was a host hit: the time was the copies' (the hybrid's copy rate)
                self._host_copies[0] += len(demand)
                self._host_copies[1] += time.perf_counter() - t_load
        except BaseException:
            self._abort(li, [(e, s) for e, s in zip(ids, slots) if s is not None])
            raise
        self.stats.wait_s[li] += time.perf_counter() - t0
        self._held = (layer, ids, slots, True)
        return li, ids, slots

    def release(self, layer: int, expert_ids: Sequence[int]) -> None:
        ids = tuple(int(e) for e in expert_ids)
        if self._held is None or self._held[:2] != (layer, ids):
            held = None if self._held is None else self._held[:2]
            raise RuntimeError(f"release(layer={layer}, {list(ids)}) does not match what is held: {held}")
        li, slots, pinned = self._layer(layer), self._held[2], self._held[3]
        with self.loads.lock:
            for slot in slots:
                self.slots.release(slot)
            if pinned:
                self.policy.unpin_slots(li, ids, slots)
        self._held = None

    def observe(self, layer: int, expert_ids: torch.Tensor) -> None:
        """The router of `layer` chose `expert_ids` [T, K]: use counts for both tiers, prediction
        scores, and the predictors' evidence (and their predictions, prefetched)."""
        li = self._layer(layer)
        ids = expert_ids.detach().to("cpu", torch.int64).numpy()  # [T, K]
        with self.loads.lock:
            if not self._settled:  # use counts choose victims; settled, nothing is ever evicted
                self.policy.record(li, ids)
            self.stats.record_routing(li, ids)
            self.loads.score_predictions(li, ids)
            self.loads.score_depths(li, ids)
        if not self._settled:
            self.host.record(layer, ids)
        self.loads.predict(li, ids)

    def prefetch(self, layer: int, expert_ids: Sequence[int], probs: Sequence[float] | None = None,
                 source: int | None = None) -> None:
        """Start loading `expert_ids` of `layer` (needed with probability `probs`) where the policy
        finds room and the probability pays for the read; returns at once. Ignored when prefetch is
        off. Predicted from model layer `source`'s hidden state (the look-ahead), they are scored
        at their depth, and without `probs` carry the look-ahead's measured precision there (1
        until measured)."""
        if self.prefetch_depth == 0:
            return
        li = self._layer(layer)
        src = None if source is None else bisect.bisect_right(self.layers.layers, source) - 1
        if probs is None and src is not None:
            probs = [self.stats.prediction_score.calibrated(LOOK_AHEAD, li - src)] * len(expert_ids)
        self.loads.announce(announcement(li, expert_ids, probs), src, LOOK_AHEAD)

    def restrict(self, owned: dict[int, Any]) -> None:
        """Predictions (the look-ahead's and the co-occurrence predictor's) of experts not in
        owned[layer] (bool [E]) are dropped before they are hinted or loaded."""
        mask = np.ones(self.loads.predicted.shape, dtype=bool)  # [L, E]
        for layer, row in owned.items():
            mask[self._layer(layer)] = np.asarray(row, dtype=bool)
        self.loads.owned = mask

    def close(self) -> None:
        self.loads.stop_thread()
        self.loads.drain_unpins(block=True)
        self.host.close()

    def memory_stats(self) -> MemoryStats:
        return self.stats

    def residency(self) -> Residency:
        """Device slots, then the host tier, then the disk (copies of the page tables)."""
        return Residency.from_tables(self.layers.layers, ("device", "host"),
                                     (self.policy.page_table.copy(), self.host.policy.page_table.copy()))

    # ---- acquire, step by step -----------------------------------------------------------------

    def _reserve(self, layer: int, li: int, ids: tuple[int, ...], slots: list[int | None]) -> tuple[list, list]:
        """Pin a device slot for every expert (into `slots`, by position), the resident ones first
        (`ExpertPolicy.hits_first`): hits as they are, loads in flight to wait for (`late`:
        (expert, slot)), others admitted for a demand load or taken over from the loader's queue
        (`demand`: (expert, slot, taken over))."""
        demand, late = [], []
        with self.loads.lock:
            order = self.policy.hits_first(li, ids)
        for i in order:
            e = ids[i]
            while True:
                with self.loads.lock:
                    slot = self.policy.lookup(li, e)
                    if slot is not None:
                        self._pin_resident(li, e, slot, demand, late)
                        break
                    try:
                        slot, evicted = self.policy.admit(li, e)
                    except PoolExhaustedError:
                        busy = self._free_a_slot(li)  # every unpinned slot is loading a prefetch
                    else:
                        self.loads.start(slot, COMPUTE)
                        self.policy.pin(li, e)
                        self.stats.device_misses[li] += 1
                        self.stats.evictions[li] += evicted is not None
                        demand.append((e, slot, False))
                        break
                if busy is not None:
                    self.loads.ready[busy].wait()
            slots[i] = slot
        self.stats.requests[li] += len(ids)
        return demand, late

    def _pin_resident(self, li: int, e: int, slot: int, demand: list, late: list) -> None:
        self.policy.pin(li, e)
        if self.loads.prefetched[slot]:
            self.stats.prefetch_used[li] += 1
            self.loads.prefetched[slot] = False
        if self.policy.is_ready(slot):
            self.stats.device_hits[li] += 1
            return
        self.stats.device_late[li] += 1
        if self.loads.job[slot] == QUEUED:  # the loader has not started it: load it here, now
            self.loads.job[slot] = COMPUTE
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
                if self.loads.job[slot] == QUEUED:
                    self.loads.cancel(li, slot)
                    self.stats.prefetch_cancelled[li] += 1
                    return None
                busy = slot
        if busy is None:
            raise PoolExhaustedError(f"layer {self.layers.layer(li)}: all {hi - lo} device slots are pinned; "
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
                        self.loads.make_host_room(layer)
            self.loads.count_host(li, layer, e, load, prefetch=taken_over)
            pending.append((e, slot, load))
        while pending:
            self._fill_demand(layer, li, *pending.popleft())

    def _fill_demand(self, layer: int, li: int, e: int, slot: int, load: HostLoad) -> None:
        expert = self.loads.host_wait(layer, e, load)
        self.loads.fill(layer, li, e, slot, expert)

    def _wait(self, li: int, late: list[tuple[int, int]]) -> None:
        """Wait for the loader to finish the prefetches compute needs."""
        for e, slot in late:
            self.loads.ready[slot].wait()
            error = self.loads.error[slot]
            if error is not None:
                raise StrataError(f"loading expert {e} of layer {self.layers.layer(li)} failed: {error}") from error

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
            with self.loads.lock:
                self.stats.dequant_s[li] += seconds
        return weights

    def _abort(self, li: int, reserved: Sequence[tuple[int, int]]) -> None:
        """Undo a failed acquire: unpin the (expert, slot) pairs it reserved; cancel the loads it
        owned or that failed."""
        with self.loads.lock:
            for e, slot in reserved:
                self.policy.unpin(li, e)
                owned = self.loads.job[slot] == COMPUTE or self.loads.error[slot] is not None
                if self.policy.slot_state[slot] == LOADING and owned and self.policy.slot_pins[slot] == 0:
                    self.loads.cancel(li, slot)

    def _place_on_device(self, layer: int, li: int, e: int) -> None:
        """Start-up: load expert `e` into a device slot the policy admits (nothing else runs)."""
        with self.loads.lock:
            slot, _ = self.policy.admit(li, e)
            self.loads.start(slot, COMPUTE)
        self.loads.fill(layer, li, e, slot, self.loads.host_wait(layer, e, self._startup_host_load(layer, e)))

    def _startup_host_load(self, layer: int, e: int) -> HostLoad:
        """A host load at start-up; host slots still pinned by device copies (CUDA) are let go when
        the layer's pool is full."""
        try:
            return self.host.load(layer, e)
        except PoolExhaustedError:
            self.loads.drain_unpins(block=True)
            return self.host.load(layer, e)

    def _disk_reads(self, li: int) -> int:
        return int(self.stats.disk_reads[li] + self.stats.prefetch_disk_reads[li])

    def _layer(self, layer: int) -> int:
        return self.layers.index(layer)


def _indexed(device: torch.device) -> torch.device:
    """'cuda' as 'cuda:N' (the current device): threads other than the caller's need the index."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


__all__ = ["TieredConfig", "TieredExpertMemory"]
