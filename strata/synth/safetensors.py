"""The one safetensors writer of synthetic checkpoints: header first, then tensors one at a time.

Tensors are produced on demand (`values(name)`), so a shard far larger than memory is written
holding one tensor at a time. Not a general safetensors library: it writes, never reads.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

#: bytes per element of the dtypes written here
ITEM_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


def write_safetensors(path: str | Path, shapes: Mapping[str, tuple[str, tuple[int, ...]]],
                      values: Callable[[str], np.ndarray], metadata: dict[str, str] | None = None) -> int:
    """Write `shapes` (name -> (dtype, shape)) to `path`, asking `values(name)` for each tensor's
    elements in order (already in that dtype's bytes, e.g. uint16 for BF16); returns data bytes."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, (dtype, shape) in shapes.items():
        nbytes = int(np.prod(shape, dtype=np.int64)) * ITEM_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, (dtype, shape) in shapes.items():
            data = np.ascontiguousarray(values(name))
            want = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            if data.nbytes != want:
                raise ValueError(f"{path}: tensor {name} ({dtype} {list(shape)}) should be {want} bytes, "
                                 f"got {data.nbytes}")
            f.write(data.tobytes())
    return offset


def save_f32(path: str | Path, tensors: Mapping[str, np.ndarray]) -> int:
    """float32 tensors held in memory, in the layout `save_pretrained` writes ({"format": "pt"})."""
    shapes = {name: ("F32", tuple(t.shape)) for name, t in tensors.items()}
    return write_safetensors(path, shapes, lambda name: tensors[name].astype(np.float32, copy=False),
                             metadata={"format": "pt"})


def to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16) by truncation."""
    return (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
