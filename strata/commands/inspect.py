"""`strata inspect MODEL.gguf [--json]`: what a GGUF file holds and where its bytes go.

Architecture and hyperparameters, tensor count and bytes per ggml type, resident weights versus
routed experts, and the size of one layer's expert slabs (the unit the pager moves). The facts
come from `strata.gguf.ModelFile.summary()`; this module only renders them.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from strata.units import format_bytes


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `inspect` on an argparse subparsers object (the `strata` CLI's)."""
    p = subparsers.add_parser("inspect", help="show a GGUF model's architecture, sizes and expert layout",
                              description=__doc__.splitlines()[0])
    p.add_argument("model", help="GGUF file")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run)
    return p


def _render(value: Any, key: str, indent: int, out: TextIO, in_bytes: bool = False) -> None:
    """One entry; numbers are byte counts when their key, or a parent's, says 'bytes'."""
    pad = "  " * indent
    in_bytes = in_bytes or "bytes" in key.lower()
    if isinstance(value, dict):
        print(f"{pad}{key}:", file=out)
        for k, v in value.items():
            _render(v, str(k), indent + 1, out, in_bytes)
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) for v in value):
        print(f"{pad}{key}:", file=out)
        for i, v in enumerate(value):
            _render(v, f"[{i}]", indent + 1, out)
    else:
        shown = value
        if isinstance(value, (int, float)) and not isinstance(value, bool) and in_bytes:
            shown = f"{format_bytes(value)} ({value})"
        elif isinstance(value, (list, tuple)) and len(value) > 16:
            shown = f"[{', '.join(map(str, value[:8]))}, ... {len(value)} values]"
        print(f"{pad}{key}: {shown}", file=out)


def render_text(summary: dict[str, Any], path: str, out: TextIO | None = None) -> None:
    """Human-readable rendering of ModelFile.summary()."""
    out = out or sys.stdout
    print(f"{path}", file=out)
    for key, value in summary.items():
        _render(value, key, 1, out)


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from strata.gguf import open_model

    out = out or sys.stdout
    with open_model(args.model) as model:
        summary = model.summary()
    if args.json:
        json.dump(summary, out, indent=1, default=str)
        print(file=out)
    else:
        render_text(summary, args.model, out)
    return 0
