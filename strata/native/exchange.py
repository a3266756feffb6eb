"""The same-host exchange of expert-parallel partial sums (native/exchange.c, exchange.h): ranks
on one machine add their MoE layers' partial sums through a shared segment. The segment's bytes
come from the caller (a mapped file); this module only checks and calls, and says which rank was
late when a wait fails. The wait runs in C without the GIL."""
from __future__ import annotations

from typing import Any

from strata.errors import NativeError

from ._lib import check, ffi, lib, status_reason


class ExchangeError(NativeError):
    """A peer did not publish its partial sum: `late` is its rank; `ended`: its process has ended
    (else it did not answer within the timeout)."""

    def __init__(self, message: str, late: int, ended: bool):
        super().__init__(message)
        self.late, self.ended = late, ended


def exchange_bytes(world: int, slot_floats: int) -> int:
    """Bytes of a segment for `world` ranks and slots of `slot_floats` float32 values."""
    n = lib.strata_exchange_bytes(world, slot_floats)
    if n < 0:
        raise ValueError(f"exchange: world {world} and slots of {slot_floats} floats: expected 1 to 4096 ranks "
                         "and a positive slot")
    return int(n)


class Exchange:
    """One rank's view of a segment (`buffer`: a writable buffer of at least exchange_bytes bytes,
    64-byte aligned, such as an mmap) of `world` ranks; `pid` marks this rank's process in it."""

    def __init__(self, buffer: Any, world: int, rank: int, slot_floats: int, pid: int):
        self.world, self.rank, self.slot_floats = world, rank, slot_floats
        self._seg = ffi.from_buffer("uint8_t[]", buffer, require_writable=True)
        self._len = len(self._seg)
        self._late = ffi.new("int *")
        check(lib.strata_exchange_init(self._seg, self._len, world, rank, slot_floats, pid),
              f"exchange: rank {rank} of {world}, a segment of {self._len} bytes")

    def release(self) -> None:
        """Drop the view of the buffer (its owner may close it afterwards)."""
        self._seg = None

    def sum(self, seq: int, partial: Any, out: Any, timeout_s: float) -> None:
        """out = the ranks' `partial`s (float32 contiguous CPU tensors of the same numel on every rank,
        at most slot_floats) added in rank order, for call `seq` (1, 2, ... the same on every rank)."""
        n = partial.numel()
        if out.numel() != n:
            raise ValueError(f"exchange: out has {out.numel()} values for a partial sum of {n}")
        status = lib.strata_exchange_sum(self._seg, self._len, self.world, self.rank, self.slot_floats, seq,
                                         ffi.cast("float *", partial.data_ptr()), n,
                                         ffi.cast("float *", out.data_ptr()), timeout_s, self._late)
        if status in (lib.STRATA_E_CLOSED, lib.STRATA_E_TIMEOUT):
            late, ended = int(self._late[0]), status == lib.STRATA_E_CLOSED
            raise ExchangeError(f"exchange {seq}: rank {late} " + ("has ended" if ended else
                                f"did not answer within {timeout_s:g} s ({status_reason(status)})"), late, ended)
        check(status, f"exchange {seq}: rank {self.rank} of {self.world}, {n} values, slots of {self.slot_floats}")


__all__ = ["Exchange", "ExchangeError", "exchange_bytes"]
