"""The machine's memory, measured in one place: what the budgets (`budget.py`) and the engine's
checks start from. Nothing else in strata reads /proc or the cgroup files or asks the GPU for its
free memory. `strata.load` measures once (`Machine.measure`) and hands the record down to the
memory's constructors and the budgets as data; the budgets never measure (tests pass a `Machine`
of their own).

MemTotal and MemAvailable of /proc/meminfo, lowered to the memory cgroup's limit (and the limit
less the cgroup's usage, reclaimable page cache not counted) when the process runs under one
(cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`, the tightest on the path from the process's
cgroup up): under a container limit the machine's RAM is not the process's to take.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

#: Where the machine's memory is read; tests point these at fake files.
MEMINFO = "/proc/meminfo"
PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"
_UNLIMITED = 1 << 60  # v1 reports "no limit" as a huge page-rounded number


def machine_memory() -> tuple[int, int]:
    """(total, available) bytes this process may use: MemTotal and MemAvailable, each no more than
    the memory cgroup's limit and its headroom when the process runs under one."""
    fields = {}
    try:
        with open(MEMINFO) as f:
            for line in f:
                key, value = line.split(":", 1)
                fields[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    total = fields.get("MemTotal") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    available = fields.get("MemAvailable", total)
    limit = cgroup_memory()
    if limit is not None:
        total, available = min(total, limit[0]), min(available, limit[1])
    return total, available


def cgroup_memory() -> tuple[int, int] | None:
    """(limit, limit - usage + inactive page cache) of the tightest memory cgroup limit on the
    path from this process's cgroup up to its hierarchy's root (v2 and v1); None when none is set."""
    best = None
    for mount, rel, (limit_file, usage_file, inactive_key) in _cgroup_dirs():
        directory = mount / rel
        while True:
            limit = _read_int(directory / limit_file)
            if limit is not None and limit < _UNLIMITED and (best is None or limit < best[0]):
                usage = _read_int(directory / usage_file) or 0
                best = (limit, max(0, limit - usage + _stat(directory / "memory.stat", inactive_key)))
            if directory == mount or mount not in directory.parents:
                break
            directory = directory.parent
    return best


def _cgroup_dirs() -> list[tuple[Path, str, tuple[str, str, str]]]:
    """(hierarchy mount, the process's cgroup path in it, names of its limit file, usage file and
    inactive page cache key) for the v2 hierarchy and for a v1 `memory` controller."""
    out = []
    try:
        lines = Path(PROC_CGROUP).read_text().splitlines()
    except OSError:
        return out
    root = Path(CGROUP_ROOT)
    for line in lines:  # "hierarchy-id:controllers:path"
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.strip().lstrip("/")
        if controllers == "":
            out.append((root, rel, ("memory.max", "memory.current", "inactive_file")))
        elif "memory" in controllers.split(","):
            out.append((root / "memory", rel, ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                               "total_inactive_file")))
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # v2 writes "max" for no limit


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


def device_memory(device: torch.device) -> tuple[int, int]:
    """(total, free) bytes of the compute device: the GPU's, or this machine's RAM."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(total), int(free)
    return machine_memory()


@dataclass(frozen=True)
class Machine:
    """The memory a load works with, measured once: (total, available) bytes of the RAM this
    process may use (`machine_memory`) and of the compute device (`device_memory`: the GPU's
    total and free memory, or the RAM again on the CPU)."""

    ram: tuple[int, int]
    device: tuple[int, int]

    @staticmethod
    def measure(device: torch.device | str = "cpu") -> Machine:
        """This process's RAM and `device`'s memory now (on CUDA: its free memory, so measure
        before allocating on it)."""
        device = torch.device(device)
        ram = machine_memory()
        return Machine(ram, device_memory(device) if device.type == "cuda" else ram)

    @staticmethod
    def cpu(total: int, available: int) -> Machine:
        """A machine without GPU of these RAM figures (tests, what-if budgets)."""
        return Machine((total, available), (total, available))


__all__ = ["Machine", "cgroup_memory", "device_memory", "machine_memory"]
