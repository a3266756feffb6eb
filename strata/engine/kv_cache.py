"""The paged KV cache: one fixed pool of fixed-size blocks shared by every sequence.

Allocated once at start: per layer k and v of [N, Hkv, P, hd] (N blocks of P = `block_size`
positions) in the compute dtype on the device. A sequence holds a slot (a handle: at most
`n_slots` sequences at once) and a block table: position j of the sequence lives in block
`table[j // P]` at offset `j % P`. Blocks are taken from the free list as a sequence grows
(`reserve`) and all go back when it ends (`free`), so many short sequences and a few long ones
share the memory; `n_ctx` stays the most positions one sequence may hold.

`BlockTables` is the bookkeeping alone (plain Python, no tensors), so the allocator and the
scheduler are tested without a model. Must not: compute attention or choose which sequence runs
(the scheduler does); it hands out and takes back blocks.
"""
from __future__ import annotations

import torch

from strata.defaults import KV_BLOCK_SIZE
from strata.errors import StrataError
from strata.models import Batch
from strata.units import itemsize

#: Positions per block. A multiple of 8 that divides the native decode attention's 256-position
#: chunk, so paged decode attention sums in the same order as over one contiguous region.
BLOCK_SIZE = KV_BLOCK_SIZE


def blocks_for(n_positions: int, block_size: int = BLOCK_SIZE) -> int:
    """Blocks that hold `n_positions` positions."""
    return -(-n_positions // block_size)


class BlockTables:
    """Slots (sequence handles) and their block tables over a pool of `n_blocks` blocks."""

    def __init__(self, n_slots: int, n_ctx: int, n_blocks: int | None = None, block_size: int = BLOCK_SIZE):
        if n_slots < 1 or n_ctx < 1 or block_size < 1:
            raise ValueError(f"KV cache: expected n_slots, n_ctx and block_size >= 1, found {n_slots}, {n_ctx}, "
                             f"{block_size}")
        self.n_slots, self.n_ctx, self.block_size = n_slots, n_ctx, block_size
        self.max_blocks = blocks_for(n_ctx, block_size)  # blocks of one full-context sequence
        self.n_blocks = n_slots * self.max_blocks if n_blocks is None else n_blocks
        if self.n_blocks < self.max_blocks:
            raise StrataError(f"KV cache: {self.n_blocks} blocks of {block_size} positions cannot hold one sequence "
                              f"of n_ctx={n_ctx} ({self.max_blocks} blocks)")
        self._free_slots = list(range(n_slots - 1, -1, -1))  # popped from the end: lowest first
        self._free_blocks = list(range(self.n_blocks - 1, -1, -1))
        self.tables: dict[int, list[int]] = {}  # slot -> its blocks, in position order

    @property
    def n_free(self) -> int:
        """Free slots."""
        return len(self._free_slots)

    @property
    def n_free_blocks(self) -> int:
        return len(self._free_blocks)

    @property
    def n_used_blocks(self) -> int:
        return self.n_blocks - len(self._free_blocks)

    def allocate(self) -> int:
        """A free slot (the lowest-numbered one), with an empty block table."""
        if not self._free_slots:
            raise StrataError(f"KV cache: all {self.n_slots} sequence slots are in use")
        slot = self._free_slots.pop()
        self.tables[slot] = []
        return slot

    def table(self, slot: int) -> list[int]:
        if slot not in self.tables:
            raise ValueError(f"KV cache: slot {slot} is not allocated")
        return self.tables[slot]

    def blocks_needed(self, slot: int, n_positions: int) -> int:
        """More blocks `slot` needs to hold positions 0..n_positions-1."""
        return max(0, blocks_for(n_positions, self.block_size) - len(self.table(slot)))

    def can_reserve(self, slot: int, n_positions: int) -> bool:
        return self.blocks_needed(slot, n_positions) <= len(self._free_blocks)

    def reserve(self, slot: int, n_positions: int) -> bool:
        """Grow `slot`'s table to hold n_positions positions: all the blocks or none (False when the
        pool has too few free blocks)."""
        if n_positions > self.n_ctx:
            raise StrataError(f"KV cache: {n_positions} positions exceed n_ctx={self.n_ctx}")
        need = self.blocks_needed(slot, n_positions)
        if need > len(self._free_blocks):
            return False
        table = self.tables[slot]
        for _ in range(need):
            table.append(self._free_blocks.pop())
        return True

    def free(self, slot: int) -> None:
        """Give back the slot and every block it holds."""
        if not 0 <= slot < self.n_slots or slot not in self.tables:
            raise ValueError(f"KV cache: slot {slot} is not allocated")
        self.release(slot)
        del self.tables[slot]
        self._free_slots.append(slot)
        self._free_slots.sort(reverse=True)

    def release(self, slot: int) -> None:
        """Give back the blocks of `slot` and keep the slot (a preempted sequence starts over)."""
        self._free_blocks.extend(reversed(self.table(slot)))
        self.tables[slot] = []


class KVCache(BlockTables):
    """The block pool's tensors plus its bookkeeping (`BlockTables`)."""

    def __init__(self, n_layers: int, n_slots: int, n_ctx: int, n_head_kv: int, head_dim: int,
                 head_dim_v: int | None = None, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", n_blocks: int | None = None, block_size: int = BLOCK_SIZE):
        super().__init__(n_slots, n_ctx, n_blocks, block_size)
        N, P = self.n_blocks, block_size
        shape_k = (N, n_head_kv, P, head_dim)
        shape_v = (N, n_head_kv, P, head_dim if head_dim_v is None else head_dim_v)  # 0: no values (MLA)
        self.k = [torch.zeros(shape_k, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape_v, dtype=dtype, device=device) for _ in range(n_layers)]
        self.device = torch.device(device)

    @staticmethod
    def bytes_for(n_layers: int, n_slots: int, n_ctx: int, n_head_kv: int, head_dim: int,
                  head_dim_v: int | None = None, dtype: torch.dtype = torch.float32, n_blocks: int | None = None,
                  block_size: int = BLOCK_SIZE) -> int:
        """Bytes a cache of these dimensions takes (before it is allocated): `n_blocks` blocks, by
        default enough for `n_slots` sequences of `n_ctx` positions each."""
        per_position = n_head_kv * (head_dim + (head_dim if head_dim_v is None else head_dim_v))
        n = n_slots * blocks_for(n_ctx, block_size) if n_blocks is None else n_blocks
        return n_layers * n * block_size * per_position * itemsize(dtype)

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[index], self.v[index]

    def batch(self, slots: list[int], starts: list[int], lengths: list[int],
              device: torch.device | str | None = None) -> Batch:
        """A model `Batch` of these slots' new tokens; blocks are reserved for them first (a
        StrataError when the pool has too few free blocks)."""
        for slot, start, n in zip(slots, starts, lengths):
            if not self.reserve(slot, start + n):
                raise StrataError(f"KV cache: no free blocks for {start + n} positions of slot {slot} "
                                  f"({self.n_free_blocks} of {self.n_blocks} free)")
        return Batch.make([self.table(s) for s in slots], starts, lengths, self.block_size,
                          self.device if device is None else device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


__all__ = ["BLOCK_SIZE", "BlockTables", "KVCache", "blocks_for"]
