"""`strata bench pager`: the pager's read rate of expert slabs beside the disk's sequential rate.

On one file, alternately: (1) the disk's sequential O_DIRECT read rate of that file, large aligned
reads with os.preadv from one thread (what `dd iflag=direct bs=8M` measures); (2) the pager
reading every expert slab of the file in random order, `depth` slabs in flight, into buffers
sized as the host tier sizes them; (3) optionally, the host tier loading every expert in random
order through its slot pool (Python bookkeeping and evictions included). Both reads bypass the
page cache, so a file the machine has cached still measures the disk. The runs alternate, one
sequential pass then one pager pass, `repeat` times: the headline ratio is the median of the
ratios of these back-to-back pairs, since a shared (or virtual) disk drifts between passes by more
than the difference being measured; the best of each figure is reported beside it. (On a virtual
disk a sequential pass right after another sequential pass of the same file can run much faster
than after any other traffic: the host caches behind the guest (benchmarks/RESULTS.md, "The
pager's reference read"). Alternating keeps the reference at the disk's own rate; an uncounted
warm-up pass starts the alternation.)

Must not print or assert: it returns data and `strata.commands.bench` prints it.
"""
from __future__ import annotations

import mmap
import os
import time
from typing import Any

import numpy as np

from strata.gguf import PARTS, ExpertSlab, open_model
from strata.memory.placement import sequential_direct_rate  # the benchmarks use it from here too
from strata.native import DEFAULT_PAGER_THREADS, Pager
from strata.units import round_up

SEQ_BLOCK = 8 << 20


def all_slabs(model) -> list[ExpertSlab]:
    """Every expert slab of `model` (gate, up, down of each expert), in file order."""
    return [model.expert(layer, e, part) for layer in model.expert_layers
            for e in range(model.hparams.n_experts) for part in PARTS]


def pager_slab_rate(pager: Pager, slabs: list[ExpertSlab], depth: int) -> float:
    """Payload bytes/s of the pager reading `slabs` in the given order, `depth` in flight."""
    align = max(pager.info.align, 1)
    cap = round_up(max(s.nbytes for s in slabs), align) + align
    ring = np.frombuffer(mmap.mmap(-1, cap * depth), dtype=np.uint8).reshape(depth, cap)  # [depth, cap]
    tickets: list[int | None] = [None] * depth
    t0 = time.perf_counter()
    for i, slab in enumerate(slabs):
        k = i % depth
        if tickets[k] is not None:
            pager.wait(tickets[k])
        tickets[k] = pager.submit(slab.offset, slab.nbytes, ring[k])
    for ticket in tickets:
        if ticket is not None:
            pager.wait(ticket)
    return sum(s.nbytes for s in slabs) / (time.perf_counter() - t0)


def random_slab_rate(path: str | os.PathLike, limit: int, *, depth: int = 16, seed: int = 0) -> float:
    """Payload bytes/s of a fresh O_DIRECT pager (the default threads) reading expert slabs of
    `path` in random order, `depth` in flight, until `limit` bytes: the access pattern of expert
    misses, where a sequential pass measures one reader streaming."""
    rng = np.random.default_rng(seed)
    with open_model(path) as model:
        slabs = all_slabs(model)
    order, total = [], 0
    for i in rng.permutation(len(slabs)):
        if total >= limit:
            break
        order.append(slabs[i])
        total += slabs[i].nbytes
    with Pager(model, DEFAULT_PAGER_THREADS, direct=True) as pager:  # every part of a split model
        return pager_slab_rate(pager, order, depth)


def host_tier_rate(model, order: list[tuple[int, int]], depth: int, n_threads: int, chunk_bytes: int,
                   budget: int | None) -> dict[str, Any]:
    """Payload bytes/s of a HostTier loading experts in `order`, `depth` loads in flight."""
    from strata.memory.host import HostTier
    from strata.memory.policy import PoolExhaustedError

    with HostTier(model, budget, n_threads=n_threads, chunk_bytes=chunk_bytes, direct=True) as host:
        in_flight, t0 = [], time.perf_counter()
        for layer, expert in order:
            if len(in_flight) == depth:
                host.wait(in_flight.pop(0))
            while True:
                try:
                    in_flight.append(host.load(layer, expert))
                    break
                except PoolExhaustedError:  # every slot of the layer is loading: finish the oldest
                    host.wait(in_flight.pop(0))
        for load in in_flight:
            host.wait(load)
        seconds = time.perf_counter() - t0
        stats = host.stats()
    return {"gbs": stats["bytes_loaded"] / seconds / 1e9, "slots_per_layer": host.slots_per_layer,
            "pool_bytes": stats["pool_bytes"], "evictions": stats["evictions"], "misses": stats["misses"]}


def _quarter_budget(model, align: int) -> int:
    """A host budget holding a quarter of each layer's experts (at least its top-k)."""
    from strata.memory.host import slot_layout

    per_layer = max(model.hparams.n_experts_used, model.hparams.n_experts // 4)
    return len(model.expert_layers) * per_layer * slot_layout(model, align).slot_bytes


def bench_pager(path: str | os.PathLike, *, n_threads: int = DEFAULT_PAGER_THREADS, chunk_bytes: int = 0,
                depth: int = 16, repeat: int = 3, host: bool = True, host_budget: int | None = None,
                seed: int = 0) -> dict[str, Any]:
    """Sequential O_DIRECT GB/s of the file beside the pager's GB/s on its expert slabs in random
    order (and the host tier's, when `host`); see the module docstring."""
    rng = np.random.default_rng(seed)
    with open_model(path) as model:
        slabs = all_slabs(model)
        order = [slabs[i] for i in rng.permutation(len(slabs))]
        experts = [(layer, e) for layer in model.expert_layers for e in range(model.hparams.n_experts)]
        expert_order = [experts[i] for i in rng.permutation(len(experts))]
        seq, slab_runs, host_runs = [], [], []
        with Pager(model, n_threads, chunk_bytes=chunk_bytes, direct=True) as pager:
            pager_slab_rate(pager, order, depth)  # warm-up: threads, buffers, the disk's burst credit
            for _ in range(repeat):
                seq.append(sequential_direct_rate(path)[0] / 1e9)
                slab_runs.append(pager_slab_rate(pager, order, depth) / 1e9)
            info, stats = pager.info, pager.stats()
        if host:
            host_budget = host_budget or _quarter_budget(model, info.align)
            host_runs.append(host_tier_rate(model, expert_order, depth, n_threads, chunk_bytes, host_budget))
        file_bytes = sum(part.size for part in model.parts)
        slab_bytes = sum(s.nbytes for s in slabs)
    result = {
        "file": os.fspath(path), "file_bytes": file_bytes, "n_slabs": len(slabs),
        "slab_bytes_mean": slab_bytes // len(slabs), "n_threads": info.n_threads, "align": info.align,
        "chunk_bytes": info.chunk_bytes, "depth": depth, "repeat": repeat,
        "sequential_direct_gbs": max(seq), "pager_slabs_gbs": max(slab_runs),
        "ratio": float(np.median([b / a for a, b in zip(seq, slab_runs)])),
        "ratio_of_bests": max(slab_runs) / max(seq),
        "runs": {"sequential_direct_gbs": seq, "pager_slabs_gbs": slab_runs},
        "pager_bytes_read_over_requested": stats["bytes_read"] / max(stats["bytes_requested"], 1),
    }
    if host_runs:
        result["host_tier"] = host_runs[0]
        result["host_tier_ratio"] = host_runs[0]["gbs"] / max(seq)
    return result
