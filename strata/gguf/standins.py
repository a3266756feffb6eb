"""Stored miss stand-ins: a sidecar GGUF beside a model holding a low-bit copy of every routed expert.

    MODEL.gguf               the model, untouched (llama.cpp and gguf-py read it as before)
    MODEL.standins.gguf      blk.N.ffn_{gate,up,down}_exps.weight: [E, rows, cols] in one type

The copies live in a file of their own because llama.cpp refuses a model file holding tensors it
does not create ("done_getting_tensors: wrong number of tensors"), so extra tensors inside the
model would cost the file its interop. The sidecar's architecture is `strata-standins` (no model
loader takes it for a model); `strata.stand_ins.type` names the type and
`strata.stand_ins.source_bytes` the model's size when the copies were made, which a load checks
(a model replaced since then makes the sidecar stale: a one-line error says how to remake it).
Fused gate_up models get separate gate and up tensors here (each expert's half of the fused one).
Must not: quantize (converters write the file) or import torch.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from strata.errors import StrataFormatError
from strata.quant import GGMLType, ggml_type

from .header import check_tensor_ranges, scan_header

STAND_INS_ARCH = "strata-standins"
STAND_INS_TYPE = "strata.stand_ins.type"
STAND_INS_SOURCE_BYTES = "strata.stand_ins.source_bytes"
STAND_INS_SUFFIX = ".standins.gguf"


def stand_ins_path(model_path: str | Path) -> Path:
    """Where the stand-ins of the model at `model_path` (its first part, when split) are stored."""
    p = Path(model_path)
    stem = p.name[:-5] if p.name.endswith(".gguf") else p.name
    return p.with_name(stem + STAND_INS_SUFFIX)


def stand_in_tensor_name(layer: int, part: str) -> str:
    return f"blk.{layer}.ffn_{part}_exps.weight"


def source_bytes(model_file) -> int:
    """The model's size as the sidecar records it: every part's bytes together."""
    return sum(part.size for part in model_file.parts)


class StoredStandIns:
    """An open sidecar: `region(layer, part)` -> uint8 [E, matrix bytes] over its memory map."""

    def __init__(self, path: Path, t: GGMLType, data: np.memmap, tensors: dict[str, tuple[tuple[int, ...], int, int]]):
        self.path, self.type, self._data, self._tensors = path, t, data, tensors

    def region(self, layer: int, part: str, n_experts: int, n_rows: int, row_len: int, matrix_bytes: int) -> np.ndarray:
        """Expert e's stand-in of `part` in `layer` at row e; checked against the model's shape."""
        name = stand_in_tensor_name(layer, part)
        if name not in self._tensors:
            raise StrataFormatError(f"{self.path}: no tensor {name!r} (the model has routed experts in layer {layer}); "
                                    "remake the file with strata convert --add-stand-ins")
        shape, offset, nbytes = self._tensors[name]
        if shape != (n_experts, n_rows, row_len) or nbytes != n_experts * matrix_bytes:
            raise StrataFormatError(f"{self.path}: tensor {name!r} is {shape} ({nbytes} B), the model's experts are "
                                    f"{(n_experts, n_rows, row_len)} ({n_experts * matrix_bytes} B in {self.type.name})")
        return self._data[offset:offset + nbytes].reshape(n_experts, matrix_bytes)


def open_stand_ins(model_file) -> StoredStandIns | None:
    """The stand-ins stored beside `model_file` (a ModelFile), or None when there is no sidecar.
    Raises StrataFormatError when the sidecar is malformed or was made for another file."""
    path = stand_ins_path(model_file.path)
    if not path.exists():
        return None
    scan = scan_header(path)
    sizes = check_tensor_ranges(path, scan)
    md = scan.metadata
    if md.get("general.architecture") != STAND_INS_ARCH or STAND_INS_TYPE not in md:
        raise StrataFormatError(f"{path}: not a stand-ins file (general.architecture {md.get('general.architecture')!r}, "
                                f"expected {STAND_INS_ARCH!r} with {STAND_INS_TYPE})")
    want = source_bytes(model_file)
    if md.get(STAND_INS_SOURCE_BYTES) != want:
        raise StrataFormatError(f"{path}: made for a model of {md.get(STAND_INS_SOURCE_BYTES)} bytes, "
                                f"{model_file.path} has {want}: remake it with strata convert --add-stand-ins "
                                f"{str(md[STAND_INS_TYPE]).lower()} {model_file.path}")
    t = ggml_type(md[STAND_INS_TYPE])
    tensors = {}
    for raw, nbytes in zip(scan.tensors, sizes):
        if raw.type_id != int(t):
            raise StrataFormatError(f"{path}: tensor {raw.name!r} is {ggml_type(raw.type_id).name}, "
                                    f"the file says {t.name}")
        tensors[raw.name] = (tuple(reversed(raw.ne)), scan.data_offset + raw.rel_offset, nbytes)
    return StoredStandIns(path, t, np.memmap(path, dtype=np.uint8, mode="r"), tensors)


__all__ = ["STAND_INS_ARCH", "STAND_INS_SOURCE_BYTES", "STAND_INS_SUFFIX", "STAND_INS_TYPE",
           "StoredStandIns", "open_stand_ins", "source_bytes", "stand_in_tensor_name", "stand_ins_path"]
