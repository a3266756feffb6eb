"""Packed experts as the native MoE kernels' regions (`native.MoeParts`), per layer, built once.

A layer's regions (the file's expert tensors, or a slot pool read with a stride) never move once
the memory is built, and building them walks the layer's slabs and allocates cffi structs, so
every backend builds them at a layer's first use and keeps them: `LayerParts` is that cache, one
for every backend (the file's tensors for `DirectExpertMemory`, the host tier's compact pool for
the paged memory and the hybrid split, the device slots for the tiered memory).
Must not compute: it describes where packed bytes are.
"""
from __future__ import annotations

from typing import Callable

from strata import native
from strata.gguf import PARTS, ModelFile


class LayerParts:
    """`parts(layer)`: `build(layer)` the first time, the same regions afterwards."""

    def __init__(self, build: Callable[[int], native.MoeParts]):
        self._build = build
        self._parts: dict[int, native.MoeParts] = {}

    def __call__(self, layer: int) -> native.MoeParts:
        parts = self._parts.get(layer)
        if parts is None:
            parts = self._parts[layer] = self._build(layer)
        return parts


def file_parts(model_file: ModelFile, layer: int) -> native.MoeParts:
    """The gate, up and down expert tensors of `layer` as the native MoE kernels' regions."""
    parts = []
    for part in PARTS:
        slab = model_file.expert(layer, 0, part)
        data, stride = model_file.expert_region(layer, part)
        parts.append(native.MoePart(data, slab.ggml_type, *slab.shape, stride=stride))
    return native.MoeParts(*parts)


__all__ = ["LayerParts", "file_parts"]
