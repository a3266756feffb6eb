"""The records `strata.gguf` hands out: plain frozen data, no file handles."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf.constants import GGMLQuantizationType


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file."""

    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]  # row-major (torch order), outermost first: reversed ggml ne
    offset: int  # byte offset in the model: in the file, or in the space of a split model's parts
    nbytes: int


@dataclass(frozen=True)
class FilePart:
    """One file of a model: the whole model, or part `index` of a split one (llama.cpp's gguf-split).
    Its byte b is the model's offset base + b (`strata.gguf.split`)."""

    index: int  # 0-based: split.no
    path: Path
    base: int
    size: int  # bytes of the file when it was opened
    tensors: tuple[str, ...]  # names of the tensors it holds, in its order


@dataclass(frozen=True)
class ExpertSlab:
    """The contiguous bytes of one part (gate, up or down) of one routed expert."""

    layer: int
    expert: int
    part: str  # "gate" | "up" | "down"
    ggml_type: GGMLQuantizationType
    shape: tuple[int, int]  # (rows, cols) row-major: gate/up [I, H], down [H, I]
    offset: int  # byte offset in the model, as TensorInfo.offset
    nbytes: int
    tensor: str  # name of the 3-D tensor the slab lies in
