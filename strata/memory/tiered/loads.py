"""Loads into the tiered memory's device slots, and the prefetch loader thread that runs them ahead.

A device slot is loaded by whoever reaches it first: the compute thread (a miss, or a queued
prefetch it takes over) or the loader thread (an admitted prediction). `SlotLoads` holds the
per-slot job state both share, the lock the memory's acquire path takes too, and the steps of
one load: start (the policy admitted the slot), read through the host tier, fill the slot (copy
or dequantize), complete or cancel.

Prefetch. Predictions come from the model's router look-ahead (`prefetch`, turned into a
`Prediction` by `predict.lookahead.announcement`) and from the memory's own predictors (fed by
`observe`, `predict.Predictor`). Each goes through `ExpertPolicy.announce`, the same call the
trace replay makes: every predicted expert is hinted, and the ones the policy finds room for are
admitted, marked loading and queued for one loader thread, which reads through the host tier (the
pager's native threads do the disk reads) and fills the slot (native dequantization releases the
GIL; on CUDA the copy and dequantization are queued on the load stream, and compute waits on that
slot's event only). A wrong prediction costs a load, never a result: slots are filled only with
the file's bytes, and compute reads a slot only after its load.

Must not: decide placement (the policies do) or compute anything but dequantization.
"""
from __future__ import annotations

import queue
import threading
import time
import weakref
from collections import deque

import numpy as np
import torch

from strata.errors import StrataError
from strata.gguf import ModelFile

from ..base import ExpertLayers
from ..device import DeviceSlots
from ..host import HostLoad, HostTier
from ..policy import ExpertPolicy, PoolExhaustedError
from ..predict import Prediction, Predictor
from ..stats import MemoryStats

# Who is loading a LOADING slot (job state per slot).
NONE, QUEUED, LOADER, COMPUTE = 0, 1, 2, 3
RETRY_S = 2e-4  # pause before retrying when every host slot of a layer is pinned by loads in flight


class SlotLoads:
    """The loads into one tiered memory's device slots and its prefetch loader thread. It owns
    the lock that guards the device policy, the statistics and the per-slot job state below;
    the memory's acquire path takes the same `lock`.

    Per slot [S]: `ready` (an event, set when no load is in flight), `job` (who loads a LOADING
    slot), `generation` (admissions so far: stale queue entries), `prefetched` (filled by a
    prefetch not yet used), `error` (a failed load's exception, for whoever waits); per (expert
    layer, expert) [L, E]: `predicted` (announced for the next step)."""

    def __init__(self, policy: ExpertPolicy, host: HostTier, slots: DeviceSlots, stats: MemoryStats,
                 layers: ExpertLayers, model_file: ModelFile, predictors: list[Predictor], read_cost: float = 0.0):
        self.policy, self.host, self.slots, self.stats = policy, host, slots, stats
        self.read_cost = read_cost  # predictions of p <= this are not loaded (`TieredConfig.prefetch_read_cost`)
        self.layers, self.model_file, self.predictors = layers, model_file, predictors
        S, L, E = policy.n_slots, len(layers), policy.page_table.shape[1]
        self.lock = threading.Lock()
        self.ready = [threading.Event() for _ in range(S)]
        for event in self.ready:
            event.set()
        self.job = np.zeros(S, dtype=np.int8)
        self.generation = np.zeros(S, dtype=np.int64)
        self.prefetched = np.zeros(S, dtype=bool)
        self.error: list[BaseException | None] = [None] * S
        self.predicted = np.zeros((L, E), dtype=bool)
        self.owned: np.ndarray | None = None  # [L, E] bool under expert parallelism: what may be predicted
        self._unpins: deque[tuple[int, int, int]] = deque()  # (slot, layer, expert): CUDA host pins to drop
        self._unpin_lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None

    def start_thread(self) -> None:
        """The loader thread; it holds the loads weakly, so dropping the memory (their only owner)
        stops it."""
        self.thread = threading.Thread(target=_loader_main, args=(weakref.ref(self), self._queue),
                                       name="strata-expert-loader", daemon=True)
        self.thread.start()
        weakref.finalize(self, self._queue.put, None)

    def stop_thread(self) -> None:
        if self.thread is not None:
            self._queue.put(None)
            self.thread.join()
            self.thread = None

    # ---- one load ------------------------------------------------------------------------------

    def start(self, slot: int, who: int) -> None:
        """A slot was just admitted (lock held): it is loading, by `who`."""
        self.generation[slot] += 1
        self.job[slot] = who
        self.prefetched[slot] = False
        self.error[slot] = None
        self.ready[slot].clear()

    def cancel(self, li: int, slot: int) -> None:
        """Give a LOADING slot back to the policy (lock held)."""
        self.policy.cancel(li, int(self.policy.slot_expert[slot]))
        self.job[slot] = NONE
        self.ready[slot].set()

    def host_wait(self, layer: int, e: int, load: HostLoad):
        """The expert's bytes in a pinned host slot, once `load` is done. A slot evicted between
        its load and this pin (by another thread's load) is loaded again."""
        while True:
            try:
                return self.host.wait(load, pin=True)
            except StrataError:
                if load.error is not None or not load.done:
                    raise
            while True:
                try:
                    load = self.host.load(layer, e)
                    break
                except PoolExhaustedError:  # every host slot of the layer loading or pinned
                    self.make_host_room(layer)

    def make_host_room(self, layer: int) -> None:
        """Every host slot of `layer` is loading or pinned: complete the loads in flight (some may
        have nobody waiting for them), else let pins go (CUDA copies) and pause."""
        if not self.host.reap(layer):
            self.drain_unpins()
            time.sleep(RETRY_S)

    def fill(self, layer: int, li: int, e: int, slot: int, expert, prefetched: bool = False) -> None:
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
        with self.lock:
            self.stats.dequant_s[li] += seconds
            self.stats.bytes_to_device[li] += written
            self.policy.complete(li, e)
            self.job[slot] = NONE
            self.prefetched[slot] = prefetched
            self.ready[slot].set()

    def count_host(self, li: int, layer: int, e: int, load: HostLoad, prefetch: bool) -> None:
        hits, reads = ((self.stats.prefetch_host_hits, self.stats.prefetch_disk_reads) if prefetch
                       else (self.stats.host_hits, self.stats.disk_reads))
        nbytes = 0 if load.hit else sum(s.nbytes for s in self.model_file.expert_slabs(layer, e))
        with self.lock:
            if load.hit:
                hits[li] += 1
            else:
                reads[li] += 1
                self.stats.bytes_disk[li] += nbytes

    def drain_unpins(self, block: bool = False) -> None:
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

    # ---- predictions ---------------------------------------------------------------------------

    def predict(self, li: int, ids: np.ndarray) -> None:
        """Feed this layer's routing [T, K] to the predictors and prefetch what they predict."""
        for predictor in self.predictors:
            predictor.observe(li, ids)
        for predictor in self.predictors:
            for prediction in predictor.predict(li, ids):
                self.announce(prediction, li, predictor.name)

    def announce(self, prediction: Prediction, source: int | None = None, name: str = "") -> None:
        """Score a prediction made from expert layer `source` (None: unscored by depth), then hint
        the experts whose probability pays for their read to both tiers and queue the loads the
        device policy admits."""
        li = prediction.layer
        if self.owned is not None:  # another rank's experts are never this rank's to load
            keep = self.owned[li, prediction.expert_ids]
            prediction = Prediction(li, prediction.expert_ids[keep], prediction.probs[keep])
        with self.lock:
            self.predicted[li, prediction.expert_ids] = True
            if source is not None:
                self.stats.prediction_score.expect(name, source, prediction)
        paid = prediction.probs > self.read_cost
        ids, probs = prediction.expert_ids[paid], prediction.probs[paid]
        self.stats.prefetch_unpaid[li] += int(paid.size - paid.sum())
        if not ids.size:
            return
        layer = self.layers.layer(li)
        self.host.hint(layer, ids, probs)
        with self.lock:
            for e, prob, admitted in self.policy.announce(li, ids, probs):
                if admitted is None:
                    self.stats.prefetch_refused[li] += 1
                    continue
                slot, evicted = admitted
                self.start(slot, QUEUED)
                self.stats.prefetch_issued[li] += 1
                self.stats.evictions[li] += evicted is not None
                self._queue.put((layer, li, e, slot, int(self.generation[slot]), prob))

    def score_predictions(self, li: int, ids: np.ndarray) -> None:
        """Lock held: compare the experts announced for this step with those routed."""
        predicted = self.predicted[li]
        if not predicted.any():
            return
        actual = np.unique(ids)
        self.stats.predicted[li] += int(predicted.sum())
        self.stats.actual[li] += actual.size
        self.stats.predicted_correct[li] += int(predicted[actual].sum())
        predicted[:] = False

    def score_depths(self, li: int, ids: np.ndarray) -> None:
        """Lock held: score the predictions pending for this layer by predictor and depth."""
        self.stats.prediction_score.routed(li, ids)

    # ---- the loader thread's work --------------------------------------------------------------

    def _run_prefetch(self, layer: int, li: int, e: int, slot: int, generation: int, prob: float) -> None:
        with self.lock:
            if self.generation[slot] != generation or self.job[slot] != QUEUED:
                return  # cancelled, or taken over by compute
            self.job[slot] = LOADER
        try:
            expert = self._prefetch_host(layer, li, e, slot, prob)
            if expert is not None:
                self.fill(layer, li, e, slot, expert, prefetched=True)
        except BaseException as exc:  # compute may be waiting for this slot: hand it the error
            with self.lock:
                self.error[slot] = exc
                if self.policy.slot_pins[slot] == 0:
                    self.cancel(li, slot)
                self.ready[slot].set()

    def _prefetch_host(self, layer: int, li: int, e: int, slot: int, prob: float):
        """The predicted expert in a pinned host slot, or None when the host tier refuses it and
        compute is not waiting for it (the device slot is then given back)."""
        while True:
            try:
                load = self.host.prefetch(layer, e, prob)
            except PoolExhaustedError:
                load = None
            if load is None:
                with self.lock:
                    if self.policy.slot_pins[slot] == 0:
                        self.cancel(li, slot)
                        self.stats.prefetch_cancelled[li] += 1
                        return None
                try:  # compute is waiting for it: load it as a demand load would
                    load = self.host.load(layer, e)
                except PoolExhaustedError:
                    self.make_host_room(layer)
                    continue
            self.count_host(li, layer, e, load, prefetch=True)
            return self.host_wait(layer, e, load)


def _loader_main(loads_ref: weakref.ref, jobs: queue.SimpleQueue) -> None:
    """The loader thread: runs queued prefetches until None arrives or the loads are gone. It
    holds them only while it works, so an unclosed memory can still be collected."""
    loads = loads_ref()
    if loads is None:
        return
    if loads.slots.cuda:
        torch.cuda.set_device(loads.slots.device.index)
    while True:
        timeout = 0.01 if loads._unpins else None  # host pins wait for copies to finish (CUDA)
        del loads
        try:
            job = jobs.get(timeout=timeout)
        except queue.Empty:
            job = ()
        loads = loads_ref()
        if job is None or loads is None:
            return
        loads.drain_unpins()
        if job:
            loads._run_prefetch(*job)


__all__ = ["COMPUTE", "LOADER", "NONE", "QUEUED", "RETRY_S", "SlotLoads"]
