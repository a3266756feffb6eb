"""Routing statistics in GGUF metadata: how often each expert was chosen on a calibration run.

    strata.routing.counts  [uint32 or float32]  L * E uses, layer-major over the file's expert
                                                layers (`ModelFile.expert_layers`, E = expert_count)
    strata.routing.tokens  uint64               tokens the counts were gathered over

A tiered expert memory seeds its placement from them (each layer's hottest experts are loaded at
start-up). They are written by `python -m strata.convert --routing-stats FILE.npz`, from a run's
`--save-routing FILE.npz` (arrays `counts` [L, E] and `tokens`).

Must not decide placement: it reads and writes the counts; `strata.memory.startup` uses them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
from gguf.constants import GGUFValueType

from strata.errors import StrataFormatError

from .header import format_error

STRATA_ROUTING_COUNTS = "strata.routing.counts"
STRATA_ROUTING_TOKENS = "strata.routing.tokens"


def read_routing_counts(path: Path, metadata: Mapping[str, Any], n_layers: int,
                        n_experts: int) -> tuple[np.ndarray, int] | None:
    """(counts [L, E] float64, n_tokens) from the file's metadata; None when both keys are absent."""
    counts, tokens = metadata.get(STRATA_ROUTING_COUNTS), metadata.get(STRATA_ROUTING_TOKENS)
    if counts is None and tokens is None:
        return None
    if not isinstance(counts, list) or not all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in counts):
        raise format_error(path, f"metadata key {STRATA_ROUTING_COUNTS!r}", "an array of numbers",
                           type(counts).__name__ if not isinstance(counts, list) else "other items")
    if len(counts) != n_layers * n_experts:
        raise format_error(path, f"metadata key {STRATA_ROUTING_COUNTS!r}",
                           f"{n_layers} expert layers x {n_experts} experts = {n_layers * n_experts} counts",
                           f"{len(counts)}")
    array = np.asarray(counts, dtype=np.float64).reshape(n_layers, n_experts)  # [L, E]
    if not np.isfinite(array).all() or (array < 0).any():
        raise format_error(path, f"metadata key {STRATA_ROUTING_COUNTS!r}", "finite counts >= 0",
                           f"{array.min()}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
        raise format_error(path, f"metadata key {STRATA_ROUTING_TOKENS!r}", "a positive token count",
                           repr(tokens))
    return array, tokens


def check_routing_types(path: Path, value_types: Mapping[str, GGUFValueType]) -> None:
    """The keys' GGUF value types (the array's item type is checked on its values)."""
    for key, expected in ((STRATA_ROUTING_COUNTS, GGUFValueType.ARRAY), (STRATA_ROUTING_TOKENS, GGUFValueType.UINT64)):
        found = value_types.get(key)
        if found is not None and found != expected:
            raise format_error(path, f"metadata key {key!r}", f"type {expected.name}", found.name)


def load_routing_npz(path: str | Path, n_layers: int, n_experts: int) -> tuple[np.ndarray, int]:
    """(counts [L, E], tokens) saved by `--save-routing`, checked against the model's shape."""
    try:
        with np.load(path) as z:
            counts, tokens = np.asarray(z["counts"]), int(z["tokens"])
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise StrataFormatError(f"{path}: not a routing statistics file (arrays 'counts' [L, E] and "
                                f"'tokens'): {exc}") from None
    if counts.dtype.kind not in "iuf" or not np.isfinite(counts).all():
        raise StrataFormatError(f"{path}: routing statistics: expected finite numeric counts, found "
                                f"{'NaN or infinite counts' if counts.dtype.kind == 'f' else counts.dtype}")
    if counts.shape != (n_layers, n_experts) or (counts < 0).any() or tokens <= 0:
        raise StrataFormatError(f"{path}: routing statistics for another model: expected counts "
                                f"[{n_layers}, {n_experts}] >= 0 over a positive token count, found "
                                f"{list(counts.shape)} over {tokens} tokens")
    return counts, tokens


def save_routing_npz(path: str | Path, counts: np.ndarray, tokens: int) -> None:
    np.savez(path, counts=np.asarray(counts, dtype=np.int64), tokens=np.int64(tokens))


def add_routing_counts(writer, counts: np.ndarray, tokens: int) -> None:
    """Add both keys to a gguf-py GGUFWriter; counts as uint32 while they fit, else float32."""
    counts = np.asarray(counts).ravel()
    if counts.size and counts.max() < 2**32 and np.array_equal(counts, np.round(counts)):
        values, sub_type = [int(c) for c in counts], GGUFValueType.UINT32
    else:
        values, sub_type = [float(c) for c in counts], GGUFValueType.FLOAT32
    writer.add_key_value(STRATA_ROUTING_COUNTS, values, GGUFValueType.ARRAY, sub_type=sub_type)
    writer.add_key_value(STRATA_ROUTING_TOKENS, int(tokens), GGUFValueType.UINT64)


__all__ = ["STRATA_ROUTING_COUNTS", "STRATA_ROUTING_TOKENS", "add_routing_counts", "check_routing_types",
           "load_routing_npz", "read_routing_counts", "save_routing_npz"]
