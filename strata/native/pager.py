"""The pager (native/pager.c): asynchronous reads of file ranges into host buffers, for the
memory tiers. Its workers run in C without the GIL; Python only submits and collects tickets.

Every status goes through `_lib.check`/`status_reason`; this module decides nothing about what to
read or where it goes (that is `strata.memory`'s job).
"""
from __future__ import annotations

import bisect
import errno
import operator
import os
from dataclasses import dataclass
from typing import Any, Iterable

from strata.defaults import DEFAULT_PAGER_THREADS
from strata.errors import NativeError
from strata.units import round_up

from ._lib import check, dst_view, ffi, lib, status_reason


class PagerTimeoutError(NativeError, TimeoutError):
    """A wait on a pager request timed out; the request is still pending (wait again)."""


_PAGER_FALLBACKS = {"pread": 0, "mmap": lib.STRATA_PAGER_FALLBACK_MMAP}
_PAGER_STATS = ("submitted", "completed", "failed", "direct", "chunks", "bytes_requested",
                "bytes_read", "read_ns", "busy_ns", "in_flight")


@dataclass(frozen=True)
class PagerInfo:
    """What a pager found at open. `align` is the O_DIRECT alignment (0 when reads are buffered)."""

    file_size: int
    align: int
    chunk_bytes: int
    n_threads: int
    direct: bool
    mmap: bool
    max_requests: int
    parts: tuple[PagerPart, ...]  # one for a single file


@dataclass(frozen=True)
class PagerPart:
    """One file of the pager: its path, where its byte 0 lies in the offsets, its size at open."""

    path: str
    base: int
    size: int
    direct: bool


def _pager_flags(direct: bool | None, fallback: str) -> int:
    if fallback not in _PAGER_FALLBACKS:
        raise ValueError(f"pager fallback must be one of {sorted(_PAGER_FALLBACKS)}, found {fallback!r}")
    flags = _PAGER_FALLBACKS[fallback]
    if direct is True:
        flags |= lib.STRATA_PAGER_DIRECT_REQUIRED
    elif direct is False:
        flags |= lib.STRATA_PAGER_DIRECT_OFF
    return flags


def _sources(source: Any) -> list[tuple[str, int]]:
    """(path, base) of every file: one path at base 0, or a model's `parts` (records with `path`
    and `base`, as `strata.gguf.ModelFile.parts`: a split model is one address space)."""
    if isinstance(source, (str, bytes, os.PathLike)):  # a path (pathlib's has `parts` of its own)
        return [(os.fsdecode(source), 0)]
    parts: Iterable[Any] | None = getattr(source, "parts", None)
    if parts is None:
        raise TypeError(f"pager: expected a path or a model with parts, found {type(source).__name__}")
    out = [(os.fsdecode(part.path), operator.index(part.base)) for part in parts]
    if not out:
        raise ValueError(f"pager: {source!r} has no parts")
    return out


class Pager:
    """Reads byte ranges of one file, or of a split model's parts, into caller buffers on
    `n_threads` native worker threads.

        with Pager("model.gguf", n_threads=4) as pager:          # or Pager(model_file): every part
            ticket = pager.submit(slab.offset, slab.nbytes, buf)   # returns at once
            start = pager.wait(ticket)                             # buf[start:start + nbytes]

    `source`: a path, or an object with `parts` ((path, base) records: `ModelFile`); offsets are
    then the model's (part i's byte 0 at its base) and a range must lie inside one part.

    `direct`: None reads with O_DIRECT when the file system allows it and the destination is
    aligned to `info.align` with room for the enclosing aligned range (see `span`), else
    buffered; True fails at open when O_DIRECT is refused; False never uses it. `fallback` picks
    how non-direct requests read: "pread" or "mmap" (a copy from a read-only mapping).
    Destinations are kept alive by the pager until their request is collected or it is closed.
    """

    def __init__(self, source: Any, n_threads: int = DEFAULT_PAGER_THREADS, *, chunk_bytes: int = 0,
                 direct: bool | None = None, fallback: str = "pread") -> None:
        sources = _sources(source)
        self.path = sources[0][0]  # the file (the first part) that names the pager in messages
        if not isinstance(n_threads, int) or not 1 <= n_threads <= 256:
            raise ValueError(f"pager threads must be an integer in 1..256, found {n_threads!r}")
        if not isinstance(chunk_bytes, int) or chunk_bytes < 0:
            raise ValueError(f"pager chunk_bytes must be a non-negative integer (0: default), found {chunk_bytes!r}")
        self._handle = self._open(sources, n_threads, chunk_bytes, _pager_flags(direct, fallback))
        self._close_native = lib.strata_pager_close  # held: module globals may be gone at exit
        self._closed = False
        self._pending: dict[int, tuple[Any, int, int]] = {}  # ticket -> (dst keep-alive, offset, nbytes)
        self.info = self._read_info(sources)
        self._bases = [part.base for part in self.info.parts]

    @staticmethod
    def _open(sources: list[tuple[str, int]], n_threads: int, chunk_bytes: int, flags: int) -> Any:
        paths = [ffi.new("char[]", os.fsencode(path)) for path, _ in sources]
        out, err, bad = ffi.new("strata_pager **"), ffi.new("int *"), ffi.new("int32_t *")
        status = lib.strata_pager_open_parts(ffi.new("char *[]", paths), ffi.new("int64_t[]", [b for _, b in sources]),
                                             len(sources), n_threads, chunk_bytes, flags, out, err, bad)
        name = sources[bad[0]][0] if 0 <= bad[0] < len(sources) else sources[0][0]
        if status == lib.STRATA_E_OPEN:
            raise NativeError(f"{name}: cannot open for reading: {os.strerror(err[0])} (errno {err[0]})")
        if status == lib.STRATA_E_DIRECT:
            raise NativeError(f"{name}: O_DIRECT was required but the file system refuses it "
                              f"(open with direct=None to fall back to buffered reads)")
        if status == lib.STRATA_E_ARG and bad[0] >= 0:
            raise NativeError(f"{name}: part {bad[0] + 1} of {len(sources)} is larger than the room its base leaves "
                              f"before the next part ({sources[bad[0] + 1][1] - sources[bad[0]][1]} bytes); "
                              "did the file grow since the model was opened?")
        check(status, f"{name}: cannot start a pager")
        return ffi.gc(out[0], lib.strata_pager_free)

    def _read_info(self, sources: list[tuple[str, int]]) -> PagerInfo:
        info, part = ffi.new("strata_pager_info *"), ffi.new("strata_pager_part *")
        lib.strata_pager_get_info(self._handle, info)
        parts = []
        for i, (path, _) in enumerate(sources):
            check(lib.strata_pager_get_part(self._handle, i, part), f"{path}: pager part {i}")
            parts.append(PagerPart(path, int(part.base), int(part.size), bool(part.direct)))
        return PagerInfo(info.file_size, info.align, info.chunk_bytes, info.n_threads, bool(info.direct),
                         bool(info.mmap), info.max_requests, tuple(parts))

    def __repr__(self) -> str:
        i = self.info
        mode = f"O_DIRECT align {i.align}" if i.direct else "mmap" if i.mmap else "buffered"
        parts = f", {len(i.parts)} parts" if len(i.parts) > 1 else ""
        return f"Pager({self.path!r}{parts}, {i.n_threads} threads, {mode}{', closed' if self._closed else ''})"

    def part_of(self, offset: int) -> PagerPart:
        """The part whose range starts at or below `offset` (the one a read from there lies in)."""
        return self.info.parts[max(0, bisect.bisect_right(self._bases, offset) - 1)]

    def span(self, offset: int, nbytes: int) -> tuple[int, int]:
        """The file range [start, end) a direct read of [offset, offset + nbytes) reads: the
        enclosing aligned range, at most round_up(nbytes, align) + align long. (offset,
        offset + nbytes) when the pager reads buffered."""
        a = self.info.align
        if not a:
            return offset, offset + nbytes
        return offset // a * a, round_up(offset + nbytes, a)

    # ---- requests ------------------------------------------------------------------------------

    def submit(self, offset: int, nbytes: int, dst: Any) -> int:
        """Queue a read of file bytes [offset, offset + nbytes) into `dst`; returns a ticket."""
        offset, nbytes = operator.index(offset), operator.index(nbytes)
        what = f"{self.path}: read of bytes [{offset}, {offset + nbytes})"
        self._check_open(what)
        ptr, dst_bytes = dst_view(dst)
        if offset < 0 or nbytes < 0 or offset + nbytes > self.info.file_size:
            raise NativeError(f"{what}: outside the file (0..{self.info.file_size} bytes)")
        part = self.part_of(offset)
        if offset + nbytes > part.base + part.size:
            raise NativeError(f"{what}: not inside one part: {part.path} holds bytes [{part.base}, "
                              f"{part.base + part.size})")
        if nbytes > dst_bytes:
            raise NativeError(f"{what}: destination holds {dst_bytes} bytes, the read needs {nbytes}")
        ticket = ffi.new("int64_t *")
        status = lib.strata_pager_submit(self._handle, offset, nbytes, ptr, dst_bytes, ticket)
        check(status, what)
        self._pending[ticket[0]] = (ptr, offset, nbytes)
        return int(ticket[0])

    def poll(self, ticket: int) -> bool:
        """True when the request has finished (collect it with `wait`)."""
        self._check_open(f"{self.path}: poll of ticket {ticket}")
        done = ffi.new("int *")
        status = lib.strata_pager_poll(self._handle, operator.index(ticket), done)
        if status != lib.STRATA_OK:
            raise NativeError(self._ticket_message(ticket, status))
        return bool(done[0])

    def wait(self, ticket: int, timeout: float | None = None) -> int:
        """Wait for a request and collect it; returns where its first byte landed in dst.
        Raises PagerTimeoutError after `timeout` seconds (the request stays pending), and
        NativeError naming the file range and errno when the read failed."""
        ticket = operator.index(ticket)
        self._check_open(f"{self.path}: wait for ticket {ticket}")
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be None or >= 0 seconds, found {timeout!r}")
        result = ffi.new("strata_pager_result *")
        timeout_ns = -1 if timeout is None else min(int(timeout * 1e9), 2**62)
        status = lib.strata_pager_wait(self._handle, ticket, timeout_ns, result)
        if status == lib.STRATA_E_TIMEOUT:
            raise PagerTimeoutError(self._ticket_message(ticket, status) + f" ({timeout} s)")
        if status != lib.STRATA_OK:
            message = (self._io_message(ticket, result) if status == lib.STRATA_E_IO
                       else self._ticket_message(ticket, status))
        if status != lib.STRATA_E_TICKET:  # collected (or cancelled): release the destination
            self._pending.pop(ticket, None)
        if status != lib.STRATA_OK:
            raise NativeError(message)
        return int(result.data_offset)

    def read(self, offset: int, nbytes: int, dst: Any) -> int:
        """Submit and wait: the bytes are in dst[start:start + nbytes] for the returned start."""
        return self.wait(self.submit(offset, nbytes, dst))

    # ---- state ---------------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Counters since open: requests, chunks, bytes requested and read, read and busy ns."""
        s = ffi.new("strata_pager_stats *")
        check(lib.strata_pager_get_stats(self._handle, s), f"{self.path}: pager stats")
        return {name: int(getattr(s, name)) for name in _PAGER_STATS}

    def bind_node(self, node: int) -> None:
        """Run the workers on the CPUs of NUMA node `node` (best effort; a no-op on one node)."""
        self._check_open(f"{self.path}: bind to NUMA node {node}")
        status = lib.strata_pager_bind_node(self._handle, operator.index(node))
        check(status, f"{self.path}: bind pager to NUMA node {node} of {numa_node_count()}")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Cancel queued reads, finish those in progress, stop the workers. Idempotent."""
        if not getattr(self, "_closed", True):
            self._closed = True
            self._close_native(self._handle)  # joins the workers: no write into dst after this
            self._pending.clear()

    __del__ = close  # before the destinations kept alive in _pending are released

    def __enter__(self) -> Pager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- messages ------------------------------------------------------------------------------

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise NativeError(f"{what}: {status_reason(lib.STRATA_E_CLOSED)}")

    def _ticket_message(self, ticket: int, status: int) -> str:
        request = self._pending.get(ticket)
        where = f" (bytes [{request[1]}, {request[1] + request[2]}))" if request else ""
        return f"{self.path}: ticket {ticket}{where}: {status_reason(status)}"

    def _io_message(self, ticket: int, result: Any) -> str:
        request = self._pending.get(ticket)
        part = self.part_of(request[1] if request else result.error_offset)
        what = (f"{part.path}: read of bytes [{request[1]}, {request[1] + request[2]})" if request
                else f"{part.path}: read")
        if result.os_errno == 0:
            try:
                now = f"is now {os.stat(part.path).st_size} bytes"
            except OSError as e:
                now = f"cannot be examined ({e.strerror})"
            return (f"{what}: the file ended early: it {now}, it had {part.size} bytes at open "
                    f"(truncated since?)")
        err = result.os_errno
        at = result.error_offset - part.base
        return (f"{what} failed at byte {at} of the file: {os.strerror(err)} "
                f"(errno {err}, {errno.errorcode.get(err, '?')})")


def numa_node_count() -> int:
    """NUMA nodes of this machine (1 where the kernel reports none)."""
    n = ffi.new("int *")
    check(lib.strata_numa_count_nodes(n), "count NUMA nodes")
    return int(n[0])


def numa_node_of(buffer: Any) -> int:
    """The NUMA node holding the first page of `buffer` (0 on a one-node machine)."""
    ptr, nbytes = dst_view(buffer)
    if nbytes == 0:
        raise ValueError("numa_node_of: empty buffer")
    node = ffi.new("int *")
    check(lib.strata_numa_locate(ptr, node), "locate buffer's NUMA node")
    return int(node[0])


__all__ = ["Pager", "PagerInfo", "PagerPart", "PagerTimeoutError", "numa_node_count", "numa_node_of"]
