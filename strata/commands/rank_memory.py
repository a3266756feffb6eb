"""`--rank-memory R:KEY=VALUE[,KEY=VALUE]`: one rank's expert-memory flags under expert parallelism.

torchrun gives every rank the same command line, yet the ranks' machines may differ (RAM, a GPU,
a disk). Each override names a rank (`1:host-mem=48G`) or a host (`big-box:host-mem=200G,
prefetch-depth=2`: every rank whose host name, or its part before the first dot, is that) and
sets memory flags on the matching ranks only; host overrides apply first, then rank overrides
(the more specific), each in command-line order. Bad syntax, an unknown key, a rank outside the
group or a value its flag refuses is a one-line error naming the override, on every rank before
any of them joins the group.
"""
from __future__ import annotations

import argparse
import socket
from typing import Any

from strata.errors import StrataArgumentError

#: The override's keys (the memory flags without their dashes) and the args fields they set.
KEYS = {"memory": "memory", "device-mem": "device_mem", "host-mem": "host_mem", "prefetch-depth": "prefetch_depth",
        "slot-form": "slot_form", "hybrid": "hybrid", "miss-stand-in": "miss_stand_in",
        "stand-in-mode": "stand_in_mode"}
SWITCH = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


def _error(spec: str, what: str) -> StrataArgumentError:
    return StrataArgumentError(f"--rank-memory {spec!r}: {what}")


def parse(spec: str) -> tuple[int | str, dict[str, Any]]:
    """(rank number or host name, {args field: value}) of one override."""
    target, sep, body = spec.partition(":")
    target = target.strip()
    if not sep or not target or not body.strip():
        raise _error(spec, "expected R:KEY=VALUE[,KEY=VALUE] (R a rank number or a host name)")
    values: dict[str, Any] = {}
    for item in body.split(","):
        key, eq, value = (x.strip() for x in item.partition("="))
        if not eq or not key or not value:
            raise _error(spec, f"expected KEY=VALUE, found {item.strip()!r}")
        if key not in KEYS:
            raise _error(spec, f"unknown key {key!r}; expected one of {', '.join(KEYS)}")
        values[KEYS[key]] = _value(spec, key, value)
    return (int(target) if target.isdigit() else target), values


def _value(spec: str, key: str, value: str) -> Any:
    if key == "prefetch-depth":
        if not value.lstrip("-").isdigit():
            raise _error(spec, f"prefetch-depth: expected an integer, found {value!r}")
        return int(value)
    if key == "hybrid":
        if value.lower() not in SWITCH:
            raise _error(spec, f"hybrid: expected on or off, found {value!r}")
        return SWITCH[value.lower()]
    return value


def matches(target: int | str, rank: int, host: str) -> bool:
    if isinstance(target, int):
        return target == rank
    return target in (host, host.split(".")[0])


def apply(args: argparse.Namespace, rank: int, world: int, host: str | None = None) -> list[str]:
    """Set the overrides that match this rank (`rank` of `world`, on `host`) on `args`; the
    overrides applied, as given. Every override is checked, matching or not."""
    from .common import memory_config

    specs = list(getattr(args, "rank_memory", None) or [])
    host = socket.gethostname() if host is None else host
    parsed = [(spec, *parse(spec)) for spec in specs]
    for spec, target, _ in parsed:
        if isinstance(target, int) and target >= world:
            raise _error(spec, f"rank {target} is outside the group (ranks 0 to {world - 1})")
    for spec, _, values in parsed:  # a value its flag refuses is an error on every rank, not only the matching one
        trial = argparse.Namespace(**{**vars(args), **values})
        try:
            memory_config(trial)
        except StrataArgumentError as e:
            raise _error(spec, str(e)) from None
    ordered = [p for p in parsed if isinstance(p[1], str)] + [p for p in parsed if isinstance(p[1], int)]
    applied = []
    for spec, target, values in ordered:
        if matches(target, rank, host):
            for field, value in values.items():
                setattr(args, field, value)
            applied.append(spec)
    memory_config(args)  # the combination (e.g. a host's memory kind with a rank's options)
    return applied


__all__ = ["KEYS", "apply", "matches", "parse"]
