"""One rank's part of one MoE layer under expert parallelism (`strata.distributed`).

Every rank routes every token; an assignment (token t, expert e) is computed by exactly one rank:
the owner of e, or for an expert held by several ranks (a replicated hot expert) its replica
t % n_owners (deterministic, the same choice on every rank). The routed experts' output is then
this rank's partial sum, and `combine` (the collective, given at construction) turns the ranks'
partial sums into the layer's sum, the same tensor on every rank.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch


class ExpertShard:
    """owners: the ranks holding each expert of the layer (E lists, ascending); rank: this one's;
    combine: [T, D] partial sum -> [T, D] sum over the ranks (the same on every rank)."""

    def __init__(self, owners: Sequence[Sequence[int]], rank: int, combine: Callable[[torch.Tensor], torch.Tensor]):
        width = max(len(r) for r in owners)
        self.n_experts, self.rank, self.combine = len(owners), rank, combine
        # owners padded by repeating their first rank: only columns < n_owners[e] are ever read
        self.owners = torch.tensor([list(r) + [r[0]] * (width - len(r)) for r in owners], dtype=torch.int64)  # [E, R]
        self.n_owners = torch.tensor([len(r) for r in owners], dtype=torch.int64)  # [E]
        #: [E] uint8: the experts whose every assignment this rank computes, when no expert is
        #: replicated (the grouping then keeps them alone: native group_assignments' `owned`); else None
        self.sole = self.owned.to(torch.uint8).contiguous() if int(self.n_owners.max()) == 1 else None

    @property
    def owned(self) -> torch.Tensor:
        """[E] bool: the experts this rank holds (alone or as a replica): all it may ever load."""
        columns = torch.arange(self.owners.shape[1])[None, :] < self.n_owners[:, None]  # [E, R]
        return ((self.owners == self.rank) & columns).any(dim=1)

    def keep(self, expert_ids: torch.Tensor) -> torch.Tensor:
        """[T, K] bool: the assignments of expert_ids [T, K] this rank computes."""
        tokens = torch.arange(expert_ids.shape[0])[:, None]  # [T, 1]
        replica = tokens % self.n_owners[expert_ids]  # [T, K]
        return self.owners[expert_ids, replica] == self.rank

    def others_to(self, expert_ids: torch.Tensor, bucket: int) -> torch.Tensor:
        """expert_ids [T, K] with the assignments other ranks compute moved to expert `bucket`
        (one past the layer's last expert), which the grouping then leaves out."""
        return torch.where(self.keep(expert_ids), expert_ids, bucket)


__all__ = ["ExpertShard"]
