"""The MoE layers' partial sums through shared memory when every rank runs on one machine.

gloo sends each all-gather through its worker and socket threads; on one machine with each rank
pinned to its own core that costs as much per token as a rank's compute, many times a bare TCP
round trip (benchmarks/RESULTS.md, "Expert parallelism: two ranks against one process"). Ranks that
find the same host (name and boot id) map one file in /dev/shm instead (native/exchange.c: each
writes its slot, publishes a sequence number and waits for the others'; the sum is added in rank
order, so the bytes are the all-gather's). The group still does everything else (start-up, the
broadcasts of sampled tokens, heartbeats); ranks on several machines, a partial sum larger than a
slot, a /dev/shm without room for the segment (its pages are reserved when it is made) or
`STRATA_EP_SHM=0` use gloo. The file is unlinked once every rank has mapped it: nothing is left
behind, whatever becomes of the processes.
"""
from __future__ import annotations

import mmap
import os
import secrets
import socket
from pathlib import Path

from strata import native

#: float32 values a rank's slot holds: partial sums of up to this many values (rows x hidden
#: size) go through shared memory; larger ones (long prefill chunks) through gloo.
SLOT_FLOATS = 2 << 20  # 8 MiB
SHM_DIR = Path("/dev/shm")
ENV = "STRATA_EP_SHM"


def host_identity() -> str:
    """This machine as the ranks compare it: host name and kernel boot id."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


class SharedSums:
    """This rank's mapping of the group's segment and its exchange."""

    def __init__(self, path: Path, world: int, rank: int, slot_floats: int, create: bool):
        size = native.exchange_bytes(world, slot_floats)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:  # every page reserved now: a full /dev/shm is a fallback to gloo, not a SIGBUS later
                os.posix_fallocate(fd, 0, size)
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            if create:
                path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        self.exchange = native.Exchange(self._map, world, rank, slot_floats, os.getpid())
        self.slot_floats, self.seq = slot_floats, 0

    def close(self) -> None:
        self.exchange.release()
        self._map.close()

    @staticmethod
    def open(group, slot_floats: int = SLOT_FLOATS) -> SharedSums | None:
        """The segment of `group` (an ExpertParallel: its gather/share collectives) when all its
        ranks run on this machine and may map /dev/shm, else None (every rank agrees either way)."""
        if os.environ.get(ENV, "1") == "0":
            return None
        if len(set(group.gather(host_identity()))) != 1 or not SHM_DIR.is_dir():
            return None
        name = f"strata-ep-{os.getpid()}-{secrets.token_hex(6)}" if group.rank == 0 else None
        mine = None
        if group.rank == 0:
            mine = _try(SHM_DIR / name, group.world_size, 0, slot_floats, create=True)
        name = group.share(name if mine is not None else "")
        if name and group.rank != 0:
            mine = _try(SHM_DIR / name, group.world_size, group.rank, slot_floats, create=False)
        everyone = all(group.gather(mine is not None)) if name else False
        if group.rank == 0 and name:
            (SHM_DIR / name).unlink(missing_ok=True)  # every rank has mapped it (or given up)
        if not everyone and mine is not None:
            mine.close()
            mine = None
        return mine


def _try(path: Path, world: int, rank: int, slot_floats: int, create: bool) -> SharedSums | None:
    try:
        return SharedSums(path, world, rank, slot_floats, create)
    except OSError:
        return None


__all__ = ["ENV", "SLOT_FLOATS", "SharedSums", "host_identity"]
