"""Which rank owns which routed experts: the shard plan of expert parallelism.

    plan = shard_plan(model_file, world_size=2, replicate_hot=4)
    plan.owners[i][e]      # the ranks holding expert e of the file's i-th expert layer (ascending)
    plan.experts_of(rank)  # [[expert ids] per expert layer]
    plan.checksum()        # equal on every rank, or the ranks do not run the same plan

Placement balances the expected load: with the file's routing statistics (`strata.routing.*`,
`ModelFile.routing_counts`) each layer's experts are placed hottest first on the rank with the
least expected load so far (ties: fewer experts, then the lower rank): the longest-processing-time
rule, within 4/3 of the best split. `replicate_hot` N: each layer's N hottest experts are held by
every rank, and each rank serves 1/world of their tokens (`owner_of`). Without statistics:
expert e on rank e % world (round-robin), and nothing to replicate. Deterministic: the same file
and arguments give the same plan on every machine.

`file_checksum` hashes the file's header and tensor table (metadata, names, types, shapes, offsets),
so ranks started on different files refuse to run together. Must not: touch torch.distributed.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from strata.errors import StrataArgumentError
from strata.gguf import ModelFile


@dataclass(frozen=True)
class ShardPlan:
    """owners[i][e]: the ranks (ascending) holding expert e of the i-th expert layer (`layers[i]`);
    load[i][e]: its expected share of the layer's assignments (uniform without statistics);
    expert_bytes[i]: one expert's bytes (gate, up, down) in that layer."""

    world_size: int
    layers: tuple[int, ...]
    owners: tuple[tuple[tuple[int, ...], ...], ...]
    load: tuple[tuple[float, ...], ...]
    expert_bytes: tuple[int, ...]
    replicate_hot: int
    from_stats: bool

    def experts_of(self, rank: int) -> list[list[int]]:
        """The experts `rank` holds, per expert layer."""
        return [[e for e, ranks in enumerate(layer) if rank in ranks] for layer in self.owners]

    def rank_load(self, rank: int) -> float:
        """`rank`'s expected share of all assignments, averaged over layers (1/world when balanced)."""
        shares = [sum(w / len(r) for w, r in zip(load, layer) if rank in r)
                  for load, layer in zip(self.load, self.owners)]
        return float(np.mean(shares)) if shares else 0.0

    def rank_bytes(self, rank: int) -> int:
        """Bytes of the experts `rank` holds, all layers."""
        return sum(len(ids) * b for ids, b in zip(self.experts_of(rank), self.expert_bytes))

    def checksum(self) -> str:
        """A short hex digest of the world size and every owner list."""
        text = repr((self.world_size, self.layers, self.owners))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def file_checksum(mf: ModelFile) -> str:
    """A short hex digest of the file's header and tensor table (not of the tensor bytes)."""
    h = hashlib.sha256()
    h.update(repr((mf.version, mf.alignment, mf.file_size)).encode())
    for key in sorted(mf.metadata):
        h.update(repr((key, mf.metadata[key])).encode())
    for name in sorted(mf.tensors):
        t = mf.tensors[name]
        h.update(repr((name, t.ggml_type.name, tuple(t.shape), t.offset, t.nbytes)).encode())
    return h.hexdigest()[:16]


def shard_plan(mf: ModelFile, world_size: int, replicate_hot: int = 0) -> ShardPlan:
    """The plan of `mf`'s routed experts over `world_size` ranks (see the module's docstring)."""
    E, layers = mf.hparams.n_experts, tuple(mf.expert_layers)
    if world_size < 1:
        raise StrataArgumentError(f"expert parallelism: world size must be at least 1, found {world_size}")
    if not 0 <= replicate_hot <= E:
        raise StrataArgumentError(f"--replicate-hot {replicate_hot}: expected 0 to {E} (the experts of a layer)")
    stats = mf.routing_counts()
    if stats is None and replicate_hot:
        raise StrataArgumentError(f"{mf.path}: --replicate-hot needs the file's routing statistics "
                                  "(strata.routing.counts: python -m strata.convert --routing-stats), which it lacks")
    counts = np.ones((len(layers), E)) if stats is None else stats[0]
    shares = [_shares(row) for row in counts]
    if stats is None:
        owners = [tuple((e % world_size,) for e in range(E)) for _ in layers]
    else:
        owners = [place_layer(share, world_size, replicate_hot) for share in shares]
    sizes = tuple(sum(s.nbytes for s in mf.expert_slabs(layer, 0)) for layer in layers)
    return ShardPlan(world_size, layers, tuple(owners), tuple(tuple(float(x) for x in s) for s in shares), sizes,
                     replicate_hot, stats is not None)


def _shares(row: np.ndarray) -> np.ndarray:
    total = row.sum()
    return row / total if total > 0 else np.full(row.shape, 1.0 / row.size)


def place_layer(share: np.ndarray, world_size: int, replicate_hot: int = 0) -> tuple[tuple[int, ...], ...]:
    """One layer's owners: its `replicate_hot` hottest experts on every rank, the others hottest
    first onto the least loaded rank (ties: fewer experts, then the lower rank)."""
    E = len(share)
    order = sorted(range(E), key=lambda e: (-share[e], e))  # hottest first, ids ascending among equals
    owners: list[tuple[int, ...]] = [()] * E
    load, count = [0.0] * world_size, [0] * world_size
    everyone = tuple(range(world_size))
    for e in order[:replicate_hot]:
        owners[e] = everyone
        for r in everyone:
            load[r] += share[e] / world_size
    for e in order[replicate_hot:]:
        r = min(everyone, key=lambda r: (load[r], count[r], r))
        owners[e] = (r,)
        load[r] += share[e]
        count[r] += 1
    return tuple(owners)


__all__ = ["ShardPlan", "file_checksum", "place_layer", "shard_plan"]
