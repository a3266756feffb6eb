"""Multi-token-prediction (MTP) blocks: the `nextn_predict_layers` blocks a file holds after the
trunk (`blk.N.nextn.*` and the block's own attention and FFN), kept on the model for speculative
decoding and never run by the main forward (as llama.cpp's main graph does not).

    model.nextn.blocks                  # [NextnBlock] in file order, empty without MTP blocks
    model.nextn.blocks[0].names         # GGUF names of the block's tensors
    model.nextn.weight("blk.4.nextn.eh_proj.weight")   # float32 [D, 2D], dequantized when asked

Must not: read files itself; the loader hands over each tensor's record and mapped bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from strata import native
from strata.arch import layer_of
from strata.gguf import TensorInfo


@dataclass(frozen=True)
class NextnBlock:
    """One MTP block: its GGUF block index and its tensors' records by name."""

    index: int
    tensors: dict[str, TensorInfo]

    @property
    def names(self) -> list[str]:
        return sorted(self.tensors)


@dataclass
class NextnLayers:
    """The model's MTP blocks; `data(name)` gives a tensor's bytes in its file type (a mapped view)."""

    blocks: list[NextnBlock] = field(default_factory=list)
    data: Callable[[str], np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.blocks)

    def info(self, name: str) -> TensorInfo:
        for block in self.blocks:
            if name in block.tensors:
                return block.tensors[name]
        raise KeyError(f"no MTP tensor {name!r} (MTP blocks: {[b.index for b in self.blocks]})")

    def weight(self, name: str) -> torch.Tensor:
        """Tensor `name` of an MTP block, dequantized to float32 (row-major shape)."""
        info = self.info(name)
        out = torch.empty(info.shape, dtype=torch.float32)
        native.dequantize_into(info.ggml_type, self.data(name), out)
        return out


def nextn_layers(tensors: dict[str, TensorInfo], data: Callable[[str], np.ndarray]) -> NextnLayers:
    """The MTP blocks of a file's `nextn` tensors (ModelFile.nextn), grouped by block."""
    by_block: dict[int, dict[str, TensorInfo]] = {}
    for name, info in tensors.items():
        by_block.setdefault(layer_of(name), {})[name] = info
    return NextnLayers([NextnBlock(i, t) for i, t in sorted(by_block.items())], data)


__all__ = ["NextnBlock", "NextnLayers", "nextn_layers"]
