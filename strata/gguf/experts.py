"""Routed-expert tensors: their names, their shapes, and where each expert's slab lies.

llama.cpp stores the routed experts of layer N as 3-D tensors with the expert index slowest
(row-major shapes, outermost first; E experts, H = n_embd, I = n_ff_exp):

    blk.N.ffn_gate_exps.weight     [E, I, H]
    blk.N.ffn_up_exps.weight       [E, I, H]
    blk.N.ffn_down_exps.weight     [E, H, I]
    blk.N.ffn_gate_up_exps.weight  [E, 2I, H]  fused form: per expert, gate rows then up rows

so expert e of a tensor is the contiguous byte range [offset + e*stride, offset + (e+1)*stride)
with stride = nbytes / E. In the fused form gate and up are the two halves of that range (rows
are whole quant blocks, so each half is a whole number of rows). Names are formatted by
`strata.arch.tensor_names` (gguf-py's tensor table, the one llama.cpp's converter writes from).

Must not read tensor data or import torch: slabs are placed from the tensor table alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from gguf.constants import MODEL_TENSOR, GGMLQuantizationType

from strata.arch import weight_pattern

from .header import format_error
from .records import ExpertSlab, TensorInfo

#: The parts of an expert, in the order `ModelFile.expert_slabs` returns them.
PARTS: tuple[str, ...] = ("gate", "up", "down")
FUSED = "gate_up"

#: Tensor kind of each routed-expert tensor (the fused form is gguf-py's FFN_GATE_UP_EXP).
EXPERT_TENSORS: dict[str, MODEL_TENSOR] = {
    "gate": MODEL_TENSOR.FFN_GATE_EXP,
    "up": MODEL_TENSOR.FFN_UP_EXP,
    "down": MODEL_TENSOR.FFN_DOWN_EXP,
    FUSED: MODEL_TENSOR.FFN_GATE_UP_EXP,
}
_LAYOUTS = ({"gate", "up", "down"}, {FUSED, "down"})
_PATTERNS = {key: weight_pattern(kind) for key, kind in EXPERT_TENSORS.items()}


def match_expert_tensor(name: str) -> tuple[str, int] | None:
    """('gate' | 'up' | 'down' | 'gate_up', layer) if `name` is a routed-expert weight, else None."""
    for key, pattern in _PATTERNS.items():
        m = pattern.match(name)
        if m:
            return key, int(m.group(1))
    return None


def expected_shape(key: str, n_experts: int, n_embd: int, n_ff_exp: int) -> tuple[int, int, int]:
    """Row-major shape llama.cpp gives each expert tensor."""
    if key == "down":
        return (n_experts, n_embd, n_ff_exp)  # [E, H, I]
    if key == FUSED:
        return (n_experts, 2 * n_ff_exp, n_embd)  # [E, 2I, H]
    return (n_experts, n_ff_exp, n_embd)  # [E, I, H]


def ff_length_from_shape(key: str, shape: tuple[int, ...]) -> int | None:
    """The expert FFN length I a 3-D expert tensor implies, or None if it is not 3-D."""
    if len(shape) != 3:
        return None
    if key == "down":
        return shape[2]
    return shape[1] // 2 if key == FUSED else shape[1]


@dataclass(frozen=True)
class PartGeometry:
    """Where one part (gate, up or down) of every expert of one layer lies."""

    tensor: str  # the 3-D tensor holding it
    ggml_type: GGMLQuantizationType
    base: int  # absolute offset of expert 0's part
    stride: int  # bytes from one expert to the next in that tensor
    nbytes: int  # bytes of the part of one expert
    shape: tuple[int, int]  # (rows, cols) row-major

    def slab(self, layer: int, expert: int, part: str) -> ExpertSlab:
        return ExpertSlab(layer, expert, part, self.ggml_type, self.shape,
                          self.base + expert * self.stride, self.nbytes, self.tensor)


@dataclass(frozen=True)
class ExpertLayer:
    """The routed experts of one layer."""

    layer: int
    n_experts: int
    fused: bool  # gate and up come from one ffn_gate_up_exps tensor
    parts: dict[str, PartGeometry]  # keyed by PARTS


def _part_geometry(info: TensorInfo) -> dict[str, PartGeometry]:
    """Geometry of the parts one 3-D expert tensor holds (two if it is the fused form)."""
    key, _layer = match_expert_tensor(info.name)
    n_experts, rows, cols = info.shape
    stride = info.nbytes // n_experts

    def geometry(part_offset: int, nbytes: int, part_rows: int) -> PartGeometry:
        return PartGeometry(info.name, info.ggml_type, info.offset + part_offset, stride, nbytes, (part_rows, cols))

    if key != FUSED:
        return {key: geometry(0, stride, rows)}
    half = stride // 2  # [2I, H]: gate rows [0, I), up rows [I, 2I)
    return {"gate": geometry(0, half, rows // 2), "up": geometry(half, half, rows // 2)}


def build_layout(path: Path, tensors: Mapping[str, TensorInfo], n_layers: int, n_experts: int,
                 n_embd: int, n_ff_exp: int) -> dict[int, ExpertLayer]:
    """Group the expert tensors by layer and check each against the metadata."""
    by_layer: dict[int, dict[str, TensorInfo]] = {}
    for name, info in tensors.items():
        hit = match_expert_tensor(name)
        if hit:
            key, layer = hit
            if n_experts <= 0:
                raise format_error(path, "metadata key expert_count", f"> 0 since tensor {name!r} holds experts",
                                   str(n_experts))
            if layer >= n_layers:
                raise format_error(path, f"tensor {name!r}: layer", f"< block_count={n_layers}", str(layer))
            by_layer.setdefault(layer, {})[key] = info
    layout = {}
    for layer in sorted(by_layer):
        found = by_layer[layer]
        if set(found) not in _LAYOUTS:
            raise format_error(path, f"expert tensors of layer {layer}", "gate, up and down (or gate_up and down)",
                               ", ".join(sorted(t.name for t in found.values())))
        for key, info in found.items():
            _check_shape(path, key, info, n_experts, n_embd, n_ff_exp)
        parts = {}
        for info in found.values():
            parts.update(_part_geometry(info))
        layout[layer] = ExpertLayer(layer, n_experts, FUSED in found, {p: parts[p] for p in PARTS})
    return layout


def _check_shape(path: Path, key: str, info: TensorInfo, n_experts: int, n_embd: int, n_ff_exp: int) -> None:
    want = expected_shape(key, n_experts, n_embd, n_ff_exp)
    if info.shape != want:
        dims = {"down": "[n_experts, n_embd, n_ff_exp]", FUSED: "[n_experts, 2*n_ff_exp, n_embd]"}
        raise format_error(path, f"tensor {info.name!r}: shape",
                           f"{want} = {dims.get(key, '[n_experts, n_ff_exp, n_embd]')} from metadata "
                           f"(expert_count={n_experts}, embedding_length={n_embd}, n_ff_exp={n_ff_exp})",
                           str(info.shape))
