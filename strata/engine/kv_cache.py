"""The KV cache: keys and values of every layer for a fixed number of sequence slots.

Allocated once at start: per layer k and v of [S, Hkv, C, hd] (S slots, C = context positions
per slot) in the compute dtype on the device. A sequence holds one slot from its first prefill
to its end; slots are handed out and taken back by `allocate` / `free`, never reallocated.
"""
from __future__ import annotations

import torch

from strata.errors import StrataError
from strata.units import itemsize


class KVCache:
    def __init__(self, n_layers: int, n_slots: int, n_ctx: int, n_head_kv: int, head_dim: int,
                 head_dim_v: int | None = None, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        self.n_slots, self.n_ctx = n_slots, n_ctx
        shape_k = (n_slots, n_head_kv, n_ctx, head_dim)
        shape_v = (n_slots, n_head_kv, n_ctx, head_dim if head_dim_v is None else head_dim_v)  # 0: no values
        self.k = [torch.zeros(shape_k, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape_v, dtype=dtype, device=device) for _ in range(n_layers)]
        self._free = list(range(n_slots - 1, -1, -1))

    @staticmethod
    def bytes_for(n_layers: int, n_slots: int, n_ctx: int, n_head_kv: int, head_dim: int,
                  head_dim_v: int | None = None, dtype: torch.dtype = torch.float32) -> int:
        """Bytes a cache of these dimensions takes (before it is allocated)."""
        per_position = n_head_kv * (head_dim + (head_dim if head_dim_v is None else head_dim_v))
        return n_layers * n_slots * n_ctx * per_position * itemsize(dtype)

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[index], self.v[index]

    @property
    def n_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        """A free slot (the lowest-numbered one)."""
        if not self._free:
            raise StrataError(f"KV cache: all {self.n_slots} sequence slots are in use")
        return self._free.pop()

    def free(self, slot: int) -> None:
        if not 0 <= slot < self.n_slots or slot in self._free:
            raise ValueError(f"KV cache: slot {slot} is not allocated")
        self._free.append(slot)
        self._free.sort(reverse=True)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


__all__ = ["KVCache"]
