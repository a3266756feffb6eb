"""`strata inspect MODEL --placement --ranks N [--replicate-hot K]`: the expert-parallel shard plan
(`strata.distributed.shard_plan`) without torchrun: which rank owns which experts of each MoE
layer (layers with the same split shown once, expert ids as ranges, `*` a replicated expert),
and each rank's expected share of the routed work and bytes of experts.

Must not: join a process group; it reads the file's header and routing statistics only.
"""
from __future__ import annotations

from typing import Any, TextIO

from strata.errors import StrataArgumentError
from strata.units import format_bytes


def id_ranges(ids: list[int], marked: set[int] = frozenset()) -> str:
    """[0, 1, 2, 5, 7] -> "0-2,5,7"; an id in `marked` stands alone with a `*`."""
    runs: list[list[int]] = []
    for e in ids:
        if runs and e == runs[-1][1] + 1 and e not in marked and runs[-1][1] not in marked:
            runs[-1][1] = e
        else:
            runs.append([e, e])
    return ",".join(f"{a}*" if a in marked else f"{a}-{b}" if b > a else str(a) for a, b in runs) or "none"


def rank_placement(mf, ranks: int, replicate_hot: int = 0) -> dict[str, Any]:
    """The shard plan of `mf` over `ranks` ranks as data: per rank its load share, expert count and
    bytes; per group of layers with one split, each rank's experts (ranges, `*` replicated)."""
    from strata.distributed import shard_plan

    if ranks < 1:
        raise StrataArgumentError(f"--ranks: expected at least 1 rank, found {ranks}")
    plan = shard_plan(mf, ranks, replicate_hot)
    per_layer = []
    for owners in plan.owners:
        shared = {e for e, r in enumerate(owners) if len(r) > 1}
        per_layer.append([id_ranges([e for e, r in enumerate(owners) if rank in r], shared) for rank in range(ranks)])
    groups: list[dict[str, Any]] = []
    for layer, split in zip(plan.layers, per_layer):
        if groups and groups[-1]["experts"] == split:
            groups[-1]["layers"].append(layer)
        else:
            groups.append({"layers": [layer], "experts": split})
    return {"ranks": ranks, "replicate_hot": replicate_hot, "from_stats": plan.from_stats,
            "plan_checksum": plan.checksum(), "n_experts": len(plan.owners[0]) if plan.owners else 0,
            "per_rank": [{"rank": r, "load_share": plan.rank_load(r), "expert_bytes": plan.rank_bytes(r),
                          "experts": sum(len(ids) for ids in plan.experts_of(r))} for r in range(ranks)],
            "layers": groups}


def render_ranks(p: dict[str, Any], out: TextIO) -> None:
    from .inspect import _layer_ranges

    how = ("balanced by the file's routing statistics" if p["from_stats"]
           else "round-robin: the file has no routing statistics")
    hot = f", each layer's {p['replicate_hot']} hottest on every rank (*)" if p["replicate_hot"] else ""
    print(f"expert parallelism over {p['ranks']} ranks ({how}{hot}; plan checksum {p['plan_checksum']}):", file=out)
    for r in p["per_rank"]:
        print(f"  rank {r['rank']}: expected load {r['load_share']:.1%}, {r['experts']} experts "
              f"({format_bytes(r['expert_bytes'])})", file=out)
    for g in p["layers"]:
        n = len(g["layers"])
        owned = "; ".join(f"rank {r}: {ids}" for r, ids in enumerate(g["experts"]))
        print(f"  layer{'s' if n > 1 else ''} {_layer_ranges(g['layers'])}: {owned}", file=out)


__all__ = ["id_ranges", "rank_placement", "render_ranks"]
