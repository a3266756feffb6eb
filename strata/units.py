"""Sizes in bytes: rounding up to an alignment, a dtype's item size, and byte counts for people.

    round_up(1000, 256) == 1024;  itemsize(torch.bfloat16) == 2;  format_bytes(3 << 29) == "1.50 GiB"

The far left of the layering: every strata package may import it. It must not import anything
from strata (nor torch or numpy): plain integer arithmetic on values handed to it.
"""
from __future__ import annotations

from typing import Any

KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


def round_up(x: int, a: int) -> int:
    """x rounded up to a multiple of a (x itself when a <= 1)."""
    return -(-x // a) * a if a > 1 else x


def itemsize(dtype: Any) -> int:
    """Bytes of one element of `dtype` (a torch.dtype or a numpy dtype)."""
    return int(dtype.itemsize)


def format_bytes(n: int | float) -> str:
    """A byte count for people: MiB below 1 GiB, GiB below 1 TiB, else TiB ("1.50 GiB")."""
    if abs(n) < GIB:
        return f"{n / MIB:.1f} MiB"
    if abs(n) < TIB:
        return f"{n / GIB:.2f} GiB"
    return f"{n / TIB:.2f} TiB"


__all__ = ["GIB", "KIB", "MIB", "TIB", "format_bytes", "itemsize", "round_up"]
