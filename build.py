"""cffi build script for Strata's native runtime (out-of-line API mode).

`native/strata.h` is both the C header and the cdef. Every `.c` file under `native/` (its floors:
formats/, kernels/ and its ISA families, executor/, runtime/) is compiled into `strata._native`; the AVX2 kernels carry their ISA in a `#pragma GCC target` inside their own
translation unit, so the rest of the library (and the scalar path) runs on any x86-64 CPU.
"""
import os
import shlex
import shutil
import sysconfig
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent
NATIVE = ROOT / "native"


def _require_compiler():
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    exe = shlex.split(cc)[0] if cc.strip() else "cc"
    if shutil.which(exe) is None:
        raise SystemExit(
            f"strata: no C compiler found (looked for {exe!r}). Strata builds a small C runtime at "
            "install time; install a C compiler and retry: Debian/Ubuntu `apt install build-essential`, "
            "Fedora `dnf install gcc`, macOS `xcode-select --install`."
        )


#: A header below native/ that says this in its opening comment is part of the cdef, after strata.h
#: (entry points kept apart from strata.h: a layer kind's step struct and functions, calibration,
#: the same-host exchange), so a new one needs no line here.
CDEF_MARK = "Read by build.py as part of the cdef"


def cdef_headers() -> tuple[str, ...]:
    """The headers that form the cdef, in order, relative to native/: strata.h, then every header
    carrying CDEF_MARK in its first five lines, by path."""
    marked = sorted(h.relative_to(NATIVE).as_posix() for h in NATIVE.rglob("*.h")
                    if CDEF_MARK in "\n".join(h.read_text().splitlines()[:5]))
    return ("strata.h", *marked)


HEADERS = cdef_headers()


def include_dirs():
    """native/ and every folder below it: sources include each other's headers by name alone."""
    return [NATIVE, *sorted(p for p in NATIVE.rglob("*") if p.is_dir() and p.name != "__pycache__")]


def _cdef():
    lines = [line for h in HEADERS for line in (NATIVE / h).read_text().splitlines()]
    return "\n".join(line for line in lines if not line.lstrip().startswith("#"))


def _sources():
    # Relative paths keep setuptools from copying absolute paths into the build metadata.
    return sorted(os.path.relpath(p, ROOT) for p in NATIVE.rglob("*.c"))


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "strata._native",
    "".join(f'#include "{Path(h).name}"\n' for h in HEADERS),
    sources=_sources(),
    include_dirs=[os.path.relpath(d, ROOT) for d in include_dirs()],
    # -ffp-contract=off: the kernels must round exactly as gguf-py's numpy code does, so no
    # multiply-add may be fused behind our back.
    extra_compile_args=["-O3", "-std=c11", "-D_GNU_SOURCE", "-pthread", "-ffp-contract=off",
                        "-fno-strict-aliasing", "-Wall", "-Wno-unused-function"],
    extra_link_args=["-pthread"],
)

if os.environ.get("STRATA_SKIP_COMPILER_CHECK") != "1":
    _require_compiler()

if __name__ == "__main__":
    import sys

    if "--check-only" not in sys.argv:
        os.chdir(ROOT)
        ffibuilder.compile(verbose=True)
