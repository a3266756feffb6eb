"""What one forward pass computes: which new tokens of which sequences (plain data).

Sequences are flattened into one token axis T (B sequences, new tokens of sequence b at
`offsets[b]:offsets[b] + lengths[b]`). Sequence b keeps its keys and values in KV-cache slot
`slots[b]`, where its first `starts[b]` positions are already cached. The engine builds batches;
model code reads them.
Must not: hold tensors of the model or schedule sequences (the engine does).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol, Sequence

import torch


class KVStore(Protocol):
    """Per-layer key and value storage: `layer(i)` -> (k, v), each [S, Hkv, C, hd] (S slots,
    C positions per slot)."""

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class Batch:
    slots: tuple[int, ...]  # [B] KV-cache slot of each sequence
    starts: tuple[int, ...]  # [B] positions already cached (= position of the first new token)
    lengths: tuple[int, ...]  # [B] new tokens of each sequence
    positions: torch.Tensor  # [T] position of every new token
    token_slots: torch.Tensor  # [T] KV-cache slot of every new token
    last: torch.Tensor  # [B] index in T of each sequence's last new token
    slot_ids: torch.Tensor  # [B] `slots` on the device

    @classmethod
    def make(cls, slots: Sequence[int], starts: Sequence[int], lengths: Sequence[int],
             device: torch.device | str = "cpu") -> Batch:
        if not (len(slots) == len(starts) == len(lengths)) or not slots:
            raise ValueError(f"a batch needs one slot, start and length per sequence, found "
                             f"{len(slots)}, {len(starts)}, {len(lengths)}")
        if min(lengths) < 1:
            raise ValueError(f"every sequence of a batch needs at least one new token, found lengths {list(lengths)}")
        positions = [p for s, n in zip(starts, lengths) for p in range(s, s + n)]
        token_slots = [slot for slot, n in zip(slots, lengths) for _ in range(n)]
        ends = list(accumulate(lengths))
        return cls(tuple(slots), tuple(starts), tuple(lengths),
                   torch.tensor(positions, dtype=torch.long, device=device),
                   torch.tensor(token_slots, dtype=torch.long, device=device),
                   torch.tensor([e - 1 for e in ends], dtype=torch.long, device=device),
                   torch.tensor(slots, dtype=torch.long, device=device))

    @property
    def offsets(self) -> list[int]:
        return [0, *accumulate(self.lengths)][:-1]

    @property
    def is_decode(self) -> bool:
        """One new token per sequence: attention for all sequences runs as one batched call."""
        return all(n == 1 for n in self.lengths)

    @property
    def n_tokens(self) -> int:
        return int(self.positions.shape[0])


__all__ = ["Batch", "KVStore"]
