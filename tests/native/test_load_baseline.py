"""The native library loads on every x86-64 CPU: what it runs when it loads (its constructors, the
functions `.init_array` names) holds no AVX instruction, whatever ISA the kernels beside them
enable. A constructor written after a translation unit's `#pragma GCC target("avx512...")` is
compiled for that ISA and kills the process with SIGILL on an AVX2-only CPU before any kernel
table is consulted (it did: the gather tiles' tables, on a Zen 3). Checked from the built library
with binutils, so it fails on any machine, not only on one that lacks the ISA."""
from __future__ import annotations

import importlib.util
import platform
import re
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or not all(shutil.which(t) for t in ("readelf", "nm", "objdump")),
    reason="needs an x86-64 build and binutils (readelf, nm, objdump)")

# Found, not imported: on a CPU without the ISA, loading a faulty build is the crash itself.
LIB = importlib.util.find_spec("strata._native").origin
# VEX/EVEX-encoded instructions (AVX and later) are the ones whose mnemonic starts with "v"; ymm,
# zmm and mask registers exist only with them. SSE2 (xmm, no "v") is part of x86-64 itself.
AVX = re.compile(r"^\s*[0-9a-f]+:\s+(v\w+)|%[yz]mm\d+|%k[0-7]\b")


def _run(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def _section(name: str) -> tuple[int, int]:
    for line in _run("readelf", "-SW", LIB).splitlines():
        fields = line.replace("[ ", "[").split()
        if len(fields) > 5 and fields[1] == name:
            return int(fields[3], 16), int(fields[5], 16)
    raise AssertionError(f"{LIB}: no {name} section")


def init_functions() -> list[tuple[str, int, int]]:
    """(name, address, size) of every function .init_array points at (its entries are filled by
    relative relocations in a shared object; a zero entry is read from the section itself)."""
    start, size = _section(".init_array")
    targets = []
    for line in _run("readelf", "-rW", LIB).splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "R_X86_64_RELATIVE" and start <= int(fields[0], 16) < start + size:
            targets.append(int(fields[3], 16))
    assert len(targets) == size // 8, f"{LIB}: {size // 8} .init_array entries, {len(targets)} relocations found"
    symbols, starts = {}, set()
    for line in _run("nm", "-S", "--defined-only", LIB).splitlines():
        fields = line.split()   # address [size] type name: crt's frame_dummy has no size
        if len(fields) in (3, 4) and fields[-2] in "tT":
            starts.add(int(fields[0], 16))
            symbols[int(fields[0], 16)] = (fields[-1], int(fields[1], 16) if len(fields) == 4 else None)
    starts = sorted(starts)
    for addr, (name, size) in symbols.items():
        if size is None:   # up to the next function
            symbols[addr] = (name, next((s for s in starts if s > addr), addr + 64) - addr)
    missing = [hex(t) for t in targets if t not in symbols]
    assert not missing, f"{LIB}: .init_array entries with no function symbol: {missing}"
    return [(symbols[t][0], t, symbols[t][1]) for t in targets]


def test_what_runs_at_load_uses_no_avx():
    functions = init_functions()
    assert functions, f"{LIB}: no .init_array"
    for name, addr, size in functions:
        listing = _run("objdump", "-d", "--no-show-raw-insn", f"--start-address={addr:#x}",
                       f"--stop-address={addr + size:#x}", LIB)
        body = [line for line in listing.splitlines() if re.match(r"^\s*[0-9a-f]+:\s", line)]
        assert body, f"{LIB}: {name} disassembled to nothing"
        avx = [line.strip() for line in body if AVX.search(line)]
        assert not avx, (f"{LIB}: {name} runs when the library loads and uses AVX instructions, which kill "
                         f"the process on CPUs without them: {avx[:3]}")
