"""Hybrid execution, the split: which experts of a chunk the CPU computes from host slots.

    ex = HybridExec(model_file, host, layers, stats, lock=lock)  # from memory.hybrid
    split = ex.split(layer, expert_ids, n_tokens, on_device)     # device_ids, cpu_ids, cpu (pinned)
    ... compute.py acquires split.device_ids as usual and, meanwhile, runs
    native.moe_swiglu over split.cpu.parts (the host pool) at split.cpu.index (host slots) ...
    ex.release(layer, split); ex.observe_cpu(layer, split, seconds)

An expert of the chunk that is not in (or loading into) a device slot but is loaded in the host
tier may be computed on the CPU with the native kernels instead of being copied: `split_chunk`
asks `plan_misses` (plan.py) with the measured `HybridRates`. Rates are measured online: every
CPU call (its tokens x packed bytes and seconds, reported by compute.py) and every demand copy
whose experts were all host hits (packed bytes and seconds from queueing the copies to their
completion, counted by the tiered memory: `HybridHost.copies`). Until the CPU rate of a layer's format is known, one
eligible expert (the one with the fewest tokens) goes to the CPU to measure it ("probe"); until
the copy rate is known, plan_misses copies everything, which measures it.

The CPU experts are pinned in the host tier from the split to `release`, so the pager
cannot overwrite them while the kernels read them. The host tier runs compact (slabs at the start
of their regions), so its pool is one strided region per part (`HostTier.layer_parts`).
Must not: compute (compute.py does), or move bytes to the device (the tiered memory does).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from strata.gguf import ModelFile

from strata.memory.base import ExpertLayers, PackedExperts
from strata.memory.host import HostTier
from strata.memory.stats import MemoryStats

from .plan import ExpertMiss, HybridRates, plan_misses


@dataclass(frozen=True)
class HybridSplit:
    """One chunk's split: `device_ids` go through acquire/release as usual; `cpu_ids` are
    computed on the CPU from `cpu` (the host pool's regions, `cpu.index[i]` the host slot of
    `cpu_ids[i]`), pinned there until `HybridExec.release`. `work` is the CPU share's tokens x packed
    bytes, `fmt` the layer's format key (the rate it is measured under)."""

    device_ids: list[int]
    cpu_ids: list[int]
    cpu: PackedExperts | None
    work: int = 0
    fmt: str = ""


def split_chunk(expert_ids: Sequence[int], n_tokens: Sequence[int], *, on_device: Callable[[int], bool],
                in_host: Callable[[int], bool], n_bytes: int, fmt: str, rates: HybridRates,
                overlap: bool = True) -> tuple[list[int], list[int]]:
    """(device ids, CPU ids) of a chunk, each in the chunk's order. Only experts neither on the
    device nor loading there (`on_device` False) and loaded in the host tier (`in_host`) may go to
    the CPU: by `plan_misses`, or, while `fmt` has no CPU rate yet, the one with the fewest tokens
    (a probe that measures the rate)."""
    if len(expert_ids) != len(n_tokens):
        raise ValueError(f"split_chunk: {len(expert_ids)} experts but {len(n_tokens)} token counts")
    misses = [ExpertMiss(int(e), int(t), n_bytes, in_host(int(e)), fmt)
              for e, t in zip(expert_ids, n_tokens) if not on_device(int(e))]
    eligible = [m for m in misses if m.in_host]
    if not eligible:
        cpu = set()
    elif rates.cpu_token_bytes_per_s.get(fmt, 0.0) <= 0:
        cpu = {min(eligible, key=lambda m: (m.n_tokens, m.expert_id)).expert_id}
    else:
        cpu = set(plan_misses(misses, rates, overlap=overlap).cpu_experts)
    return [int(e) for e in expert_ids if int(e) not in cpu], [int(e) for e in expert_ids if int(e) in cpu]


class HybridExec:
    """The hybrid state of one tiered memory: rates, the host pool's regions per layer, and the
    CPU experts pinned by the current split. Thread-safe as far as the host tier is; one split is
    held at a time (as one acquire is). `lock`: the memory's, held while the statistics change."""

    def __init__(self, model_file: ModelFile, host: HostTier, layers: ExpertLayers, stats: MemoryStats,
                 rates: HybridRates | None = None, overlap: bool = True, lock=None):
        if not host.compact:
            raise ValueError("hybrid compute reads the host pool in place: the host tier must be compact")
        self.model_file, self.host, self.layers, self.stats = model_file, host, layers, stats
        self.rates, self.overlap, self.lock = rates or HybridRates(), overlap, lock or threading.Lock()
        self.learn = True  # fold measurements into `rates` (tests freeze chosen rates by clearing it)
        self._format: list[tuple[str, int]] = [layer_format(model_file, layer) for layer in layers]
        self._held: tuple[int, list[int]] | None = None

    def split(self, layer: int, expert_ids: Sequence[int], n_tokens: Sequence[int],
              on_device: Callable[[int], bool]) -> HybridSplit:
        li = self.layers.index(layer)
        if self._held is not None:
            raise RuntimeError(f"hybrid split of layer {layer} while layer {self._held[0]} CPU experts "
                               f"{self._held[1]} are still held: release them first")
        fmt, n_bytes = self._format[li]
        device_ids, cpu_ids = split_chunk(expert_ids, n_tokens, on_device=on_device,
                                          in_host=lambda e: self.host.is_ready(layer, e),
                                          n_bytes=n_bytes, fmt=fmt, rates=self.rates, overlap=self.overlap)
        pinned, slots = [], []
        for e in cpu_ids:
            expert = self.host.pin_if_ready(layer, e)  # None: evicted since the look-up
            if expert is not None:
                pinned.append(e)
                slots.append(expert.slot)
        if len(pinned) < len(cpu_ids):
            device_ids = [int(e) for e in expert_ids if int(e) not in set(pinned)]
        if not pinned:
            return HybridSplit(device_ids, [], None, 0, fmt)
        parts = self.host.layer_parts(layer)
        tokens = dict(zip((int(e) for e in expert_ids), (int(t) for t in n_tokens)))
        self._held = (layer, pinned)
        return HybridSplit(device_ids, pinned, PackedExperts(parts, slots),
                           sum(tokens[e] for e in pinned) * n_bytes, fmt)

    def release(self, layer: int, split: HybridSplit) -> None:
        if not split.cpu_ids:
            return
        if self._held != (layer, split.cpu_ids):
            raise RuntimeError(f"hybrid release of layer {layer} CPU experts {split.cpu_ids} does not match what "
                               f"is held: {self._held}")
        for e in split.cpu_ids:
            self.host.unpin(layer, e)
        self._held = None

    def observe_cpu(self, layer: int, split: HybridSplit, seconds: float) -> None:
        """The model computed `split`'s CPU experts in `seconds`."""
        li = self.layers.index(layer)
        with self.lock:
            self.stats.cpu_computed[li] += len(split.cpu_ids)
            self.stats.cpu_s[li] += seconds
        if self.learn and split.cpu_ids:
            self.rates.observe_cpu(split.fmt, 1, split.work, seconds)

    def observe_copy(self, n_bytes: int, seconds: float) -> None:
        """Demand copies of `n_bytes` packed bytes (host hits only) took `seconds`."""
        if self.learn:
            self.rates.observe_copy(n_bytes, seconds)

    def expert_bytes(self, layer: int) -> int:
        return self._format[self.layers.index(layer)][1]


def layer_format(model_file: ModelFile, layer: int) -> tuple[str, int]:
    """(format key, packed bytes of one expert) of `layer`: the key names the gate, up and down
    types ('Q4_K/Q4_K/Q6_K'), so layers of different types are measured apart."""
    slabs = model_file.expert_slabs(layer, 0)
    return "/".join(s.ggml_type.name for s in slabs), int(np.sum([s.nbytes for s in slabs]))


__all__ = ["HybridExec", "HybridSplit", "layer_format", "split_chunk"]
