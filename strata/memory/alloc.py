"""A process-wide counter of the buffers the memory system allocates, so tests can hold it to
"every pool is allocated once at start": after start-up, decoding must not move the counter.

Every buffer of `strata.memory` (slot pools, scratch, staging, host pools) is made by `empty` or
reported with `record`; torch's own temporaries in model code are not buffers of the memory system.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch


@dataclass
class AllocationCounter:
    """Buffers allocated and their bytes, in total and by what they are for."""

    count: int = 0
    nbytes: int = 0
    by_what: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, nbytes: int, what: str) -> None:
        with self._lock:
            self.count += 1
            self.nbytes += int(nbytes)
            self.by_what[what] = self.by_what.get(what, 0) + int(nbytes)

    def snapshot(self) -> tuple[int, int]:
        """(count, bytes) so far."""
        with self._lock:
            return self.count, self.nbytes


#: The counter of this process.
ALLOCATIONS = AllocationCounter()


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str, what: str,
          pin: bool = False) -> torch.Tensor:
    """`torch.empty` of a memory-system buffer, counted in ALLOCATIONS under `what`."""
    t = torch.empty(shape, dtype=dtype, device=device, pin_memory=pin)
    ALLOCATIONS.record(t.numel() * t.element_size(), what)
    return t


def record(nbytes: int, what: str) -> None:
    """Count a buffer allocated by other means (the host tier's page-aligned pool)."""
    ALLOCATIONS.record(nbytes, what)


__all__ = ["ALLOCATIONS", "AllocationCounter", "empty", "record"]
