"""llama.cpp without its AMX kernels, on CPUs whose AMX path crashes in the build the benchmarks use.

llama-cpp-python 0.3.36 built with GGML_NATIVE on an Intel Xeon with AMX-INT8 segfaults in
`ggml_backend_amx_mul_mat` on every file we tried (the tiny interop models, the medium synthetic
file). The tests switch off all of llama.cpp's extra buffer types there (tests/conftest.py); the
benchmarks keep its repacked rows (REPACK, its fast path on AVX2 and AVX-512 machines) and take only
AMX away: llama.cpp enables AMX with `arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)` and, when the
kernel refuses, runs as on a CPU without AMX ("AMX is not ready to be used!"). `deny_amx()` makes
the kernel refuse, with a seccomp filter on this one request, for the calling thread and every
thread and process it starts afterwards. `STRATA_BENCH_LLAMA_AMX=1` leaves AMX alone.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

ARCH_REQ_XCOMP_PERM = 0x1023
_NR_ARCH_PRCTL = 158           # x86-64
_AUDIT_ARCH_X86_64 = 0xC000003E
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_EPERM = 0x7FFF0000, 0x00050000 | 1
_LD_ABS_W, _JEQ_K, _RET_K = 0x20, 0x15, 0x06   # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K


class _Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Insn))]


def cpu_has_amx() -> bool:
    try:
        return " amx_int8" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def amx_wanted() -> bool:
    """Whether llama.cpp may use AMX here: the CPU has it and STRATA_BENCH_LLAMA_AMX=1 asks for it."""
    return cpu_has_amx() and os.environ.get("STRATA_BENCH_LLAMA_AMX") == "1"


def deny_amx() -> bool:
    """Refuse this process's requests for AMX state from now on; False where the CPU has no AMX, AMX
    was asked for, or the filter could not be installed (then llama.cpp may crash: the caller says so)."""
    if not cpu_has_amx() or amx_wanted():
        return False
    # seccomp_data: nr at 0, arch at 4, args[0] at 16 (its low 32 bits, little-endian)
    program = [(_LD_ABS_W, 0, 0, 4), (_JEQ_K, 0, 5, _AUDIT_ARCH_X86_64),
               (_LD_ABS_W, 0, 0, 0), (_JEQ_K, 0, 3, _NR_ARCH_PRCTL),
               (_LD_ABS_W, 0, 0, 16), (_JEQ_K, 0, 1, ARCH_REQ_XCOMP_PERM),
               (_RET_K, 0, 0, _RET_EPERM), (_RET_K, 0, 0, _RET_ALLOW)]
    insns = (_Insn * len(program))(*[_Insn(*i) for i in program])
    prog = _Prog(len(program), insns)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0


def open_without_extra_buffers():
    """From now on llama-cpp-python opens models without llama.cpp's extra buffer types (its AMX and
    repacked-row copies: `use_extra_bufts`, llama-cli's `--no-repack`); returns a function that
    undoes it. For the tests on AMX CPUs (tests/conftest.py) and llama.cpp inside a memory limit,
    where the anonymous repacked copies cannot fit (packed_vs_llama.py --out-of-ram)."""
    import llama_cpp.llama_cpp as lib

    default = lib.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    lib.llama_model_default_params = params
    return lambda: setattr(lib, "llama_model_default_params", default)
