"""GGUF tensor names: the one place they are formatted and parsed.

Templates come from gguf-py's `TENSOR_NAMES` (the table llama.cpp's converter writes from, e.g.
`blk.{bid}.ffn_gate_exps`); a full name adds the layer index and a suffix (`.weight`, `.bias`),
as llama.cpp's `tn(LLM_TENSOR_..., "weight", il)` does. Names only: no files, no values.

An architecture's tensor kinds (`tensor_kinds`) and the map from checkpoint names to GGUF names
(`tensor_name_map`) come from gguf-py's tables for its record's `tensors`; an architecture newer
than the installed gguf-py lists llama.cpp's kinds itself (`Arch.tensor_set`) beside the closest
architecture gguf-py has, so its files keep their own name (`Arch.name`) and exactly its tensors.
"""
from __future__ import annotations

import re

from gguf.constants import MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES
from gguf.tensor_mapping import TensorNameMap, get_tensor_name_map

#: Suffix llama.cpp appends to a weight's base name.
WEIGHT_SUFFIX = ".weight"
_LAYER = re.compile(r"^blk\.(\d+)\.")


def weight_name(kind: MODEL_TENSOR, layer: int | None = None, suffix: str = "weight") -> str:
    """Full GGUF name of a tensor, e.g. (FFN_GATE_EXP, 3) -> 'blk.3.ffn_gate_exps.weight'; suffix "":
    the bare name, as llama.cpp's `tn(LLM_TENSOR_..., il)` gives it (`ssm_a`, hy_v3's `exp_probs_b`)."""
    template = TENSOR_NAMES[kind]
    base = template.format(bid=layer) if layer is not None else template
    return f"{base}.{suffix}" if suffix else base


def weight_pattern(kind: MODEL_TENSOR) -> re.Pattern[str]:
    """Regex matching the weight of `kind` in any layer; group 1 is the layer index."""
    template = re.escape(TENSOR_NAMES[kind] + WEIGHT_SUFFIX)
    return re.compile(template.replace(re.escape("{bid}"), r"(\d+)") + "$")


def layer_of(name: str) -> int | None:
    """The layer index of a per-layer tensor name ('blk.N.…'), None for a global tensor."""
    m = _LAYER.match(name)
    return int(m[1]) if m else None


def tensor_kinds(arch) -> tuple[MODEL_TENSOR, ...]:
    """The tensor kinds of architecture record `arch` (an `Arch`), in llama.cpp's order: its own
    `tensor_set` where it has one, else gguf-py's table for its `tensors`."""
    return tuple(arch.tensor_set) or tuple(MODEL_TENSORS[arch.tensors])


def tensor_name_map(arch, n_blocks: int) -> TensorNameMap:
    """gguf-py's map from checkpoint tensor names to GGUF names for architecture record `arch` with
    `n_blocks` blocks. With a `tensor_set`: the map of its `tensors` architecture narrowed to those
    kinds, plus gguf-py's names for the kinds that architecture's table lacks."""
    names = get_tensor_name_map(arch.tensors, n_blocks)
    if not arch.tensor_set:
        return names
    kinds, known = set(arch.tensor_set), set(MODEL_TENSORS[arch.tensors])
    names.mapping = {key: found for key, found in names.mapping.items() if found[0] in kinds}
    for kind in kinds - known:
        template = TENSOR_NAMES[kind]
        if "{bid}" not in template:
            names.mapping.update(dict.fromkeys((template, *TensorNameMap.mappings_cfg.get(kind, ())), (kind, template)))
        for bid in range(n_blocks) if "{bid}" in template else ():
            keys = (template, *TensorNameMap.block_mappings_cfg.get(kind, ()))
            names.mapping.update(dict.fromkeys((k.format(bid=bid) for k in keys), (kind, template.format(bid=bid))))
    return names


__all__ = ["WEIGHT_SUFFIX", "layer_of", "tensor_kinds", "tensor_name_map", "weight_name", "weight_pattern"]
