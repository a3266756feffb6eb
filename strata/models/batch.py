"""What one forward pass computes: which new tokens of which sequences (plain data), and where
their keys and values live in the paged KV cache.

Sequences are flattened into one token axis T (B sequences, new tokens of sequence b at
`offsets[b]:offsets[b] + lengths[b]`). Sequence b has its first `starts[b]` positions cached
already. The cache is a pool of blocks of P positions (per layer [N, Hkv, P, hd]); position j of
sequence b lives in block `tables[b][j // P]` at offset `j % P`. The new tokens may be a whole
prompt, a chunk of one (starts > 0, several new tokens) or one decoded token. The engine builds
batches; model code reads them, and reads the cache through `read_pages`.
Must not: hold tensors of the model or schedule sequences (the engine does).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate
from typing import Protocol, Sequence

import torch

from strata.quant_torch import dequantize_q8_0, quantize_q8_0


class KVStore(Protocol):
    """Per-layer key and value storage: `layer(i)` -> (k, v), each [N, Hkv, P, hd] (N blocks of P
    positions)."""

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class Batch:
    tables: tuple[tuple[int, ...], ...]  # [B] blocks of each sequence, covering its positions 0..start+length-1
    starts: tuple[int, ...]  # [B] positions already cached (= position of the first new token)
    lengths: tuple[int, ...]  # [B] new tokens of each sequence
    block_size: int  # P: positions per cache block
    positions: torch.Tensor  # [T] position of every new token
    token_blocks: torch.Tensor  # [T] cache block of every new token
    token_offsets: torch.Tensor  # [T] its offset in that block
    last: torch.Tensor  # [B] index in T of each sequence's last new token
    block_table: torch.Tensor  # [B, M] int64 `tables` on the device, rows padded with block 0
    slots: tuple[int, ...] | None = None  # [B] cache slot of each sequence: its row of per-sequence state (recurrent layers)
    # what a layer leaves for a later layer of the same pass (a sparse-attention layer's choice of positions)
    scratch: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def make(cls, tables: Sequence[Sequence[int]], starts: Sequence[int], lengths: Sequence[int], block_size: int,
             device: torch.device | str = "cpu", slots: Sequence[int] | None = None) -> Batch:
        if not (len(tables) == len(starts) == len(lengths)) or not tables:
            raise ValueError(f"a batch needs one block table, start and length per sequence, found "
                             f"{len(tables)}, {len(starts)}, {len(lengths)}")
        if slots is not None and (len(slots) != len(tables) or len(set(slots)) != len(slots)):
            raise ValueError(f"a batch needs one distinct cache slot per sequence, found {list(slots)}")
        if min(lengths) < 1 or min(starts) < 0:
            raise ValueError(f"every sequence of a batch needs at least one new token at a position >= 0, found "
                             f"starts {list(starts)}, lengths {list(lengths)}")
        P = block_size
        need = [-(-(s + n) // P) for s, n in zip(starts, lengths)]
        if any(len(t) < k for t, k in zip(tables, need)):
            raise ValueError(f"block tables of {[len(t) for t in tables]} blocks of {P} positions do not cover "
                             f"positions up to {[s + n for s, n in zip(starts, lengths)]}")
        tables = tuple(tuple(t[:k]) for t, k in zip(tables, need))
        positions = [p for s, n in zip(starts, lengths) for p in range(s, s + n)]
        token_blocks = [t[p // P] for t, s, n in zip(tables, starts, lengths) for p in range(s, s + n)]
        width = max(need)
        ends = list(accumulate(lengths))
        T, B = len(positions), len(tables)
        # One tensor made at once (a decode step builds a batch per token), then its parts as views.
        flat = torch.tensor([*positions, *token_blocks, *(p % P for p in positions), *(e - 1 for e in ends),
                             *(b for t in tables for b in (*t, *(0,) * (width - len(t))))],
                            dtype=torch.long, device=device)
        return cls(tables, tuple(starts), tuple(lengths), P, flat[:T], flat[T:2 * T], flat[2 * T:3 * T],
                   flat[3 * T:3 * T + B], flat[3 * T + B:].view(B, width),
                   None if slots is None else tuple(slots))

    @cached_property
    def slot_ids(self) -> torch.Tensor | None:
        """`slots` as an int64 CPU tensor (what the native recurrent steps read), made once per batch."""
        return None if self.slots is None else torch.tensor(self.slots, dtype=torch.int64)

    @property
    def offsets(self) -> list[int]:
        return [0, *accumulate(self.lengths)][:-1]

    @property
    def upto(self) -> int:
        """The largest position of the batch + 1."""
        return max(s + n for s, n in zip(self.starts, self.lengths))

    @property
    def is_decode(self) -> bool:
        """One new token per sequence: attention for all sequences runs as one batched call."""
        return all(n == 1 for n in self.lengths)

    @property
    def n_tokens(self) -> int:
        return int(self.positions.shape[0])

    def write(self, cache: torch.Tensor, values: torch.Tensor) -> None:
        """cache [N, Hkv, P, d] at every new token's block and offset <- values [T, Hkv, d] (a uint8
        cache holds rows of Q8_0 blocks: the values are quantized)."""
        rows = quantize_q8_0(values) if cache.dtype == torch.uint8 else values.to(cache.dtype)
        cache[self.token_blocks, :, self.token_offsets] = rows

    def read(self, cache: torch.Tensor, b: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Positions 0..starts[b]+lengths[b]-1 of sequence b: [Hkv, L, d] from cache [N, Hkv, P, d],
        in `dtype` (None: the cache's; a Q8_0 cache's blocks are dequantized, float32 by default)."""
        return read_values(read_pages(cache, self.block_table[b], self.starts[b] + self.lengths[b]), dtype)

    def read_all(self, cache: torch.Tensor, length: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Positions 0..length-1 of every sequence: [B, Hkv, length, d] (past a sequence's own
        positions: whatever block 0 or its last block holds; mask those), in `dtype` as `read`."""
        return read_values(read_pages(cache, self.block_table, length), dtype)


def read_values(rows: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """Cache rows read by read_pages as values in `dtype`: uint8 rows are Q8_0 blocks."""
    if rows.dtype == torch.uint8:
        rows = dequantize_q8_0(rows)
    return rows if dtype is None else rows.to(dtype)


def read_pages(cache: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    """Positions 0..length-1 through block table [..., M] of cache [N, Hkv, P, d]: [..., Hkv, length, d]."""
    P = cache.shape[2]
    n = -(-length // P)
    pages = cache[table[..., :n]]  # [..., n, Hkv, P, d]
    pages = pages.transpose(-3, -4)  # [..., Hkv, n, P, d]
    return pages.reshape(*pages.shape[:-3], n * P, pages.shape[-1])[..., :length, :]


__all__ = ["Batch", "KVStore", "read_pages", "read_values"]
