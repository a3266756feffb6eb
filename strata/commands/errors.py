"""How every command ends: its exit code, or one line on stderr for an error Strata can explain.

`strata ...` and `python -m strata.convert` both run through `run_guarded`, so a StrataError or an
OSError (a missing file, a full disk) is one line naming what failed and exit status 1, Ctrl-C is
exit status 130, and a closed pipe (`strata ... | head`) is a quiet exit 0. Never a traceback for
an error the user can fix. Anything else (a bug) is a last-resort one-line message naming the
exception, exit status 1; with STRATA_DEBUG=1 it raises instead, so the traceback shows (the fuzz
tests run so, to catch errors that escaped the checks where values enter).
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from strata.errors import StrataError


def os_error_text(exc: OSError) -> str:
    """An OSError as a user reads it: `FILE: no such file or directory`, not `[Errno 2] ...: 'FILE'`."""
    if exc.strerror is None:
        return str(exc)
    reason = exc.strerror[:1].lower() + exc.strerror[1:]
    if exc.filename is None:
        return reason
    names = f"{exc.filename} -> {exc.filename2}" if exc.filename2 is not None else str(exc.filename)
    return f"{names}: {reason}"


def run_guarded(func: Callable[[argparse.Namespace], int | None], args: argparse.Namespace, *,
                prefix: str = "strata: ", interrupted: str = "strata: interrupted") -> int:
    """`func(args)`'s exit code; errors printed as `{prefix}error: {message}` and exit code 1."""
    try:
        return int(func(args) or 0)
    except BrokenPipeError:  # the reader left, nothing more to say (before OSError: it is one)
        sys.stderr.close()
        return 0
    except StrataError as exc:
        print(f"{prefix}error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{prefix}error: {os_error_text(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        return 130
    except MemoryError:
        print(f"{prefix}error: out of memory", file=sys.stderr)
        return 1
    except Exception as exc:  # the safety net: a bug, still one line unless debugging
        if os.environ.get("STRATA_DEBUG", "") not in ("", "0"):
            raise
        message = " ".join(str(exc).split())[:500]
        print(f"{prefix}error: internal error ({type(exc).__name__}: {message}); "
              f"STRATA_DEBUG=1 shows the traceback", file=sys.stderr)
        return 1
