"""The expert-memory interface (`ExpertMemory`) and the per-expert weights it hands out."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class ExpertWeights:
    """One routed expert's SwiGLU matrices in the compute dtype on the compute device.

    D = n_embd, I = n_ff_exp; the expert computes down @ (silu(gate @ x) * (up @ x)).
    """

    gate: torch.Tensor  # [I, D]
    up: torch.Tensor  # [I, D]
    down: torch.Tensor  # [D, I]


class ExpertMemory(ABC):
    """Where model code gets routed experts' weights from.

    Protocol, per layer: `observe(layer, expert_ids)` reports the routing of the step, then
    `acquire(layer, expert_ids)` returns one `ExpertWeights` per id, valid
    until `release(layer, expert_ids)`; at most `max_acquire` experts are held at once, so the
    caller acquires in chunks of that size. `prefetch(layer, expert_ids)` is a hint that those
    experts will be acquired soon: it never changes results and may be ignored.
    """

    device: torch.device
    dtype: torch.dtype
    max_acquire: int
    #: Layers ahead the model should announce with `prefetch` (0: the memory does not use hints).
    prefetch_depth: int = 0

    @abstractmethod
    def acquire(self, layer: int, expert_ids: Sequence[int]) -> list[ExpertWeights]:
        """Weights of `expert_ids` of `layer`, in the order given."""

    @abstractmethod
    def release(self, layer: int, expert_ids: Sequence[int]) -> None:
        """Give back experts acquired with the same arguments; their weights may be reused."""

    def prefetch(self, layer: int, expert_ids: Sequence[int], probs: Sequence[float] | None = None) -> None:
        """Hint: `expert_ids` of `layer` are needed soon (with probabilities `probs`, default 1).
        The default does nothing."""

    def observe(self, layer: int, expert_ids: torch.Tensor) -> None:
        """The router of `layer` chose `expert_ids` [T, K] for this step (before `acquire`):
        routing statistics for placement and prediction. The default does nothing."""

    def memory_stats(self):
        """Counters of hits, misses, bytes and waits (`strata.memory.stats.MemoryStats`), or None."""
        return None

    def close(self) -> None:
        """Free buffers and stop workers, if any."""


__all__ = ["ExpertMemory", "ExpertWeights"]
