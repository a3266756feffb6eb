"""Where a model's experts start, and where a step's expert reads will come from, before any load:
the estimate behind `strata inspect MODEL --placement` and the start-up warning of the slow path.

With routing statistics in the file (`strata.routing.*`), each layer's hottest experts start in
the device slots and the host tier holds its own hottest set (start-up placement, `startup.py`);
a request is served by the device if its expert is placed there, else by the host, else by the
disk, weighted by the statistics' routing shares. Without statistics, routing is taken as uniform
and the pools as full of distinct experts (the steady state once warm): device share d/E, host
share (max(d, h) - d)/E, disk the rest. The disk's rate, when asked for, is measured by reading a
slice of the model file with O_DIRECT. Must not allocate pools or start threads.
"""
from __future__ import annotations

import mmap
import os
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from strata.errors import SlowPathWarning
from strata.gguf import ModelFile
from strata.units import format_bytes

#: Warn at start when more than this share of expert reads is expected to come from the disk.
SLOW_PATH_SHARE = 0.5
#: Bytes read from the model file to measure the disk's rate for the warning.
DISK_PROBE_BYTES = 64 << 20


@dataclass
class Placement:
    n_layers: int
    n_experts: int
    top_k: int
    device_slots: int  # per layer
    host_slots: int  # per layer
    source: str  # "routing statistics" or "uniform routing"
    device_share: float  # expected share of expert requests served by each tier
    host_share: float
    disk_share: float
    expert_bytes: float  # mean bytes of one expert (its three slabs)
    layers: list[dict] = field(default_factory=list)  # per layer: device and host experts (with statistics)

    @property
    def disk_bytes_per_token(self) -> float:
        """Expert bytes read from the disk per decoded token (one sequence)."""
        return self.disk_share * self.top_k * self.n_layers * self.expert_bytes


def estimate(model: ModelFile, device_slots: int, host_slots: int) -> Placement:
    """The start-up placement and the expected share of requests per tier (module docstring)."""
    hp, layers = model.hparams, model.expert_layers
    L, E, k = len(layers), hp.n_experts, hp.n_experts_used
    d, h = min(device_slots, E), min(host_slots, E)
    expert_bytes = float(np.mean([sum(s.nbytes for s in model.expert_slabs(layer, 0)) for layer in layers]))
    routing = model.routing_counts()
    if routing is None:
        dev, host = d / E, (max(d, h) - d) / E
        return Placement(L, E, k, d, h, "uniform routing", dev, host, max(0.0, 1.0 - dev - host), expert_bytes)
    counts = routing[0]
    shares, per_layer = np.zeros(3), []
    for li in range(L):
        order = np.argsort(-counts[li], kind="stable")
        p = counts[li] / max(counts[li].sum(), 1e-12)
        on_device, on_host = set(order[:d].tolist()), set(order[:h].tolist())
        dev = sum(p[e] for e in on_device)
        host = sum(p[e] for e in on_host - on_device)
        shares += (dev, host, 1.0 - dev - host)
        per_layer.append({"layer": layers[li], "device": sorted(on_device), "host": sorted(on_host - on_device)})
    dev, host, disk = shares / L
    return Placement(L, E, k, d, h, "routing statistics", float(dev), float(host), max(0.0, float(disk)),
                     expert_bytes, per_layer)


def plan_placement(model: ModelFile, device, dtype, compute: str, *, machine, device_mem=None, host_mem=None,
                   reserved: int = 0) -> tuple[object, int, Placement]:
    """(the device plan, host slots per layer, the placement estimate) the tiered memory would
    make for these budgets on `machine` (`Machine`), without allocating anything (`strata inspect
    --placement`). reserved: resident weights and KV cache."""
    import torch

    from .budget import make_plan
    from .device import expert_geometry

    device = torch.device(device)
    plan = make_plan(model, expert_geometry(model), device, dtype, machine=machine, device_mem=device_mem,
                     host_mem=host_mem, reserved=reserved,
                     slot_form="packed" if compute == "packed" else None)  # packed compute reads packed slots
    budget, host_slots = host_slots_for(model, machine, plan.host_budget if host_mem is not None else None)
    return plan, host_slots, estimate(model, plan.slots_per_layer, host_slots)


def host_slots_for(model: ModelFile, machine, budget: int | None) -> tuple[int, int]:
    """(the budget, slots per layer) of a host slot pool (`HostTier`) of `budget` bytes (None:
    `budget.default_host_budget` of `machine`): the tiered memory's host tier, the paged memory's
    one pool of RAM slots."""
    from strata import native

    from .budget import check_host_budget, default_host_budget, slot_layout

    with native.Pager(model, 1) as pager:
        layout = slot_layout(model, pager.info.align)
    budget = default_host_budget(model, layout, machine) if budget is None else budget
    budget = check_host_budget(budget, model, layout, model.hparams.n_experts_used, machine)
    return budget, min(model.hparams.n_experts, budget // layout.slot_bytes // len(model.expert_layers))


def sequential_direct_rate(path: str | os.PathLike, block: int = 8 << 20, limit: int | None = None) -> tuple[float, int]:
    """(bytes/s, bytes read) of one thread reading `path` front to back with O_DIRECT, `block`
    bytes per preadv. Raises OSError when the file system refuses O_DIRECT."""
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT requires
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        size = os.fstat(fd).st_size if limit is None else min(limit, os.fstat(fd).st_size)
        done, t0 = 0, time.perf_counter()
        while done < size:
            n = os.preadv(fd, [buf], done)
            if n <= 0:
                break
            done += n
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
        buf.close()
    return done / max(seconds, 1e-9), done


def warn_if_slow(model: ModelFile, placement: Placement, one_tier: bool = False) -> str | None:
    """Warn (`SlowPathWarning`, once per load) when most expert reads are expected from the disk,
    with the rate that bounds decoding; returns the message, or None when there is nothing to say.
    one_tier: the paged memory's single pool of RAM slots (its device_slots)."""
    if placement.disk_share <= SLOW_PATH_SHARE:
        return None
    per_token = placement.disk_bytes_per_token
    try:
        biggest = max(model.parts, key=lambda part: part.size)  # a split model's parts share a disk, mostly
        rate, _ = sequential_direct_rate(biggest.path, limit=DISK_PROBE_BYTES)
        bound = f"at this disk's {rate / 1e9:.2f} GB/s that allows at most {rate / per_token:.2f} tokens/s"
    except OSError:
        bound = "the disk's rate bounds decoding"
    E = placement.n_experts
    tiers = (f"{placement.device_slots}/{E} experts in RAM" if one_tier else
             f"{placement.device_slots}/{E} experts on the device, {placement.host_slots}/{E} in host RAM")
    message = (f"{model.path}: with these budgets about {placement.disk_share:.0%} of expert reads will come from the "
               f"disk (per layer {tiers}; {placement.source}): {format_bytes(per_token)} per token; {bound}. Raise "
               f"--host-mem{'' if one_tier else ' (or --device-mem)'} to keep more experts in memory")
    warnings.warn(message, SlowPathWarning, stacklevel=3)
    return message


__all__ = ["DISK_PROBE_BYTES", "Placement", "SLOW_PATH_SHARE", "estimate", "host_slots_for", "plan_placement", "sequential_direct_rate", "warn_if_slow"]
