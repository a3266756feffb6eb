"""GGUF tensor names: the one place they are formatted and parsed.

Templates come from gguf-py's `TENSOR_NAMES` (the table llama.cpp's converter writes from, e.g.
`blk.{bid}.ffn_gate_exps`); a full name adds the layer index and a suffix (`.weight`, `.bias`),
as llama.cpp's `tn(LLM_TENSOR_..., "weight", il)` does. Names only: no files, no values.
"""
from __future__ import annotations

import re

from gguf.constants import MODEL_TENSOR, TENSOR_NAMES

#: Suffix llama.cpp appends to a weight's base name.
WEIGHT_SUFFIX = ".weight"
_LAYER = re.compile(r"^blk\.(\d+)\.")


def weight_name(kind: MODEL_TENSOR, layer: int | None = None, suffix: str = "weight") -> str:
    """Full GGUF name of a tensor, e.g. (FFN_GATE_EXP, 3) -> 'blk.3.ffn_gate_exps.weight'."""
    template = TENSOR_NAMES[kind]
    return f"{template.format(bid=layer) if layer is not None else template}.{suffix}"


def weight_pattern(kind: MODEL_TENSOR) -> re.Pattern[str]:
    """Regex matching the weight of `kind` in any layer; group 1 is the layer index."""
    template = re.escape(TENSOR_NAMES[kind] + WEIGHT_SUFFIX)
    return re.compile(template.replace(re.escape("{bid}"), r"(\d+)") + "$")


def layer_of(name: str) -> int | None:
    """The layer index of a per-layer tensor name ('blk.N.…'), None for a global tensor."""
    m = _LAYER.match(name)
    return int(m[1]) if m else None


__all__ = ["WEIGHT_SUFFIX", "layer_of", "weight_name", "weight_pattern"]
