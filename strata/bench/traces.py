"""Where the routing traces are: the project's shared folder (`shared/traces/`) sits beside the
checkout (`../shared/traces/`) or beside one of its parents; `STRATA_TRACE` names a trace file or
a folder of traces (CI's `.ci/run` exports it when `../shared/traces/` is there)."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout


def trace_dirs(root: Path = ROOT) -> list[Path]:
    """Folders to look in, first match wins: $STRATA_TRACE (a folder, or a file's folder), then
    shared/traces beside the checkout and beside each of its parents."""
    env = os.environ.get("STRATA_TRACE")
    first = [] if not env else [Path(env) if Path(env).is_dir() else Path(env).parent]
    return first + [p / "shared" / "traces" for p in root.parents]


def find_trace(name: str, root: Path = ROOT) -> Path | None:
    """The trace file `name` (`$STRATA_TRACE` itself when it is a file of that name), or None."""
    env = os.environ.get("STRATA_TRACE")
    if env and Path(env).is_file() and Path(env).name == name:
        return Path(env)
    return next((d / name for d in trace_dirs(root) if (d / name).is_file()), None)


__all__ = ["find_trace", "trace_dirs"]
