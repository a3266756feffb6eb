"""The records `strata.gguf` hands out: plain frozen data, no file handles."""
from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import GGMLQuantizationType


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file."""

    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]  # row-major (torch order), outermost first: reversed ggml ne
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class ExpertSlab:
    """The contiguous bytes of one part (gate, up or down) of one routed expert."""

    layer: int
    expert: int
    part: str  # "gate" | "up" | "down"
    ggml_type: GGMLQuantizationType
    shape: tuple[int, int]  # (rows, cols) row-major: gate/up [I, H], down [H, I]
    offset: int  # absolute byte offset in the file
    nbytes: int
    tensor: str  # name of the 3-D tensor the slab lies in
