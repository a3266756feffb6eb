"""The SIGBUS guard (native/guard.c): a mapped model file cut short under a running model reads
zeros and is counted, instead of killing the process.

    guard = MapGuard(np.memmap(path, dtype=np.uint8, mode="r"))   # the whole read-only mapping
    ...                                  # kernels, numpy, any thread read the map
    if guard.faults:                     # a page past the file's end was touched: results are wrong
        raise StrataError(f"{path}: ...")
    guard.close()                        # before the mapping is unmapped

The guard decides nothing: callers check `faults` after their work and refuse its results.
"""
from __future__ import annotations

import mmap
from typing import Any

from strata.errors import NativeError

from ._lib import check, ffi, lib, src_view

#: Mappings the guard holds at once (native/guard.c's table).
MAX_GUARDED = 4096


class MapGuard:
    """Guards one read-only mapping of a file, from its first byte to its end (see the module).

    `mapping`: a buffer whose first byte starts a mapping (np.memmap of a whole file, mmap.mmap).
    The guard holds no reference to it: `close()` it before the mapping goes (a guarded range
    that is unmapped and mapped anew would hide that mapping's faults)."""

    def __init__(self, mapping: Any) -> None:
        self._id: int | None = None
        ptr, nbytes = src_view(mapping)
        address = int(ffi.cast("uintptr_t", ptr))
        if address % mmap.PAGESIZE or nbytes <= 0:
            raise ValueError(f"guard: expected a whole mapping (page-aligned, not empty), found {nbytes} bytes "
                             f"at {address:#x}")
        out = ffi.new("int32_t *")
        status = lib.strata_guard_add(ptr, nbytes, out)
        if status == lib.STRATA_E_NOMEM:
            raise NativeError(f"guard a mapping of {nbytes} bytes: {MAX_GUARDED} mappings are guarded already "
                              "(close the models no longer used)")
        check(status, f"guard a mapping of {nbytes} bytes")
        self._id, self.nbytes = int(out[0]), nbytes
        self._out = ffi.new("int64_t[2]")  # faults, zeroed_from: read after every step, allocated once
        self._remove = lib.strata_guard_remove  # held: module globals may be gone at exit

    @property
    def faults(self) -> int:
        """Faults past the file's end turned into zero pages so far (0 while the file is whole)."""
        return self._state()[0]

    @property
    def zeroed_from(self) -> int:
        """The byte from which the mapping reads zeros since a fault (`nbytes`: none), even if the
        file grows back."""
        return self._state()[1]

    def _state(self) -> tuple[int, int]:
        if self._id is None:
            return 0, self.nbytes
        out = self._out
        check(lib.strata_guard_faults(self._id, out, out + 1), "guard faults")
        return int(out[0]), int(out[1])

    @property
    def closed(self) -> bool:
        return self._id is None

    def close(self) -> None:
        """Stop guarding (idempotent)."""
        if self._id is not None:
            self._remove(self._id)
            self._id = None

    __del__ = close

    def __repr__(self) -> str:
        return f"MapGuard({self.nbytes} bytes{', closed' if self.closed else f', {self.faults} faults'})"


__all__ = ["MAX_GUARDED", "MapGuard"]
