"""What one rank of an expert-parallel group did: decode rate, bytes read from its disk, bytes
exchanged with the other ranks (over the network, or through shared memory for `shared_share` of
the MoE layers' exchanges when every rank runs on one machine), and where its forward passes' time
went (compute, waiting for the disk, the MoE layers' exchanges).

    before = snapshot(model, ep)          # cumulative counters (ep None: one process)
    ... decode n tokens in s seconds ...
    figures(before, snapshot(model, ep), n, s)

Counters come from `Model.time_split` (forward seconds and processed tokens), the expert memory's
statistics (`bytes_disk`, `wait_s`: the paged memory's waits are for slabs read from the disk) and
`ExpertParallel.counters` (the all-gathers' payload and seconds, rank 0's broadcasts). Compute is
the forward passes' time less the two waits; `rest` is the wall time outside forward passes
(sampling, scheduling, the broadcast of rank 0's tokens).
"""
from __future__ import annotations

from typing import Any

_NET = ("bytes_sent", "bytes_received", "collective_s", "control_bytes", "calls", "shared_calls")


def snapshot(model, ep=None) -> dict[str, Any]:
    """Cumulative counters of `model` (and of its rank `ep`, a `strata.distributed.ExpertParallel`)."""
    split = model.time_split()
    stats = model.memory_stats()
    net = ep.counters() if ep is not None else {}
    return {"rank": 0 if ep is None else ep.rank, "world_size": 1 if ep is None else ep.world_size,
            "tokens": int(split["tokens"]), "forward_s": float(split["total_s"]),
            "wait_s": 0.0 if stats is None else float(stats.total("wait_s")),
            "bytes_disk": 0 if stats is None else int(stats.total("bytes_disk")),
            **{k: net.get(k, 0) for k in _NET}}


def figures(before: dict[str, Any], after: dict[str, Any], tokens: int, seconds: float) -> dict[str, Any]:
    """Per-token figures between two snapshots, over `tokens` tokens decoded in `seconds` of wall
    time (one token per step: the per-token figures are per step)."""
    d = {k: after[k] - before[k] for k in ("forward_s", "wait_s", "bytes_disk", *_NET)}
    n = max(tokens, 1)
    compute = max(d["forward_s"] - d["wait_s"] - d["collective_s"], 0.0)
    return {"rank": after["rank"], "world_size": after["world_size"], "tokens": tokens, "seconds": seconds,
            "tok_s": tokens / seconds if seconds > 0 else 0.0,
            "disk_bytes_per_token": d["bytes_disk"] / n,
            "net_bytes_sent_per_token": d["bytes_sent"] / n, "net_bytes_received_per_token": d["bytes_received"] / n,
            "control_bytes_per_token": d["control_bytes"] / n, "collectives_per_token": d["calls"] / n,
            "shared_share": d["shared_calls"] / d["calls"] if d["calls"] else 0.0,
            "ms_per_token": {"compute": 1e3 * compute / n, "disk_wait": 1e3 * d["wait_s"] / n,
                             "collective": 1e3 * d["collective_s"] / n,
                             "rest": 1e3 * max(seconds - d["forward_s"], 0.0) / n}}


def since_load(model, ep, completion) -> dict[str, Any]:
    """This rank's figures since load, per processed token (prompt and generated), with the decode
    rate of `completion` (the last `generate`'s): what `strata generate --stats` reports per rank."""
    now = snapshot(model, ep)
    zero = {k: 0 for k in now}
    out = figures(zero, now, now["tokens"], now["forward_s"])
    out["tok_s"] = completion.tokens_per_second
    del out["ms_per_token"]["rest"], out["seconds"]  # no wall time is kept since load
    return out


__all__ = ["figures", "since_load", "snapshot"]
