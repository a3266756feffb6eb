"""How every command ends: its exit code, or one line on stderr for an error Strata can explain.

`strata ...` and `python -m strata.convert` both run through `run_guarded`, so a StrataError or an
OSError (a missing file, a full disk) is one line naming what failed and exit status 1, Ctrl-C is
exit status 130, and a closed pipe (`strata ... | head`) is a quiet exit 0. Never a traceback for
an error the user can fix; programming errors still raise.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from strata.errors import StrataError


def run_guarded(func: Callable[[argparse.Namespace], int | None], args: argparse.Namespace, *,
                prefix: str = "strata: ", interrupted: str = "strata: interrupted") -> int:
    """`func(args)`'s exit code; errors printed as `{prefix}error: {message}` and exit code 1."""
    try:
        return int(func(args) or 0)
    except BrokenPipeError:  # the reader left, nothing more to say (before OSError: it is one)
        sys.stderr.close()
        return 0
    except (StrataError, OSError) as exc:
        print(f"{prefix}error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        return 130
