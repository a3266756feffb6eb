"""`ModelFile`: a validated, memory-mapped view of a GGUF model with one slab per expert.
Must not: import torch or interpret tensor values (it hands out bytes and shapes).
"""
from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from gguf.gguf_reader import GGUFReader

from strata.errors import StrataError, StrataFormatError
from strata.quant import ggml_type

from .experts import PARTS, ExpertLayer, build_layout, match_expert_tensor
from .header import HeaderScan, RawTensor, check_tensor_ranges, format_error, scan_header
from .hparams import HParams, read_hparams
from .records import ExpertSlab, TensorInfo
from .routing import check_routing_types, read_routing_counts

_PART_INDEX = {part: i for i, part in enumerate(PARTS)}

# Fields GGUFReader adds for the preamble; they are not metadata keys.
_READER_PSEUDO_FIELDS = frozenset({"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"})


def open_model(path: str | Path, *, cross_check: bool = False) -> ModelFile:
    """Open and validate the GGUF model file at `path`; reads the header only, never tensor data.

    Raises StrataFormatError naming the file and the offending key or tensor when the file is
    malformed, truncated, of an unsupported version or architecture, or contradicts itself.
    `cross_check=True` also parses the file with gguf-py's GGUFReader and requires it to agree
    on every metadata value and tensor record (seconds for a real tokenizer, so off by default).
    """
    path = Path(path)
    scan = scan_header(path)
    tensors = _tensor_infos(scan, check_tensor_ranges(path, scan))
    if cross_check:
        _check_gguf_py_agrees(path, scan.metadata, tensors)
    hparams = read_hparams(path, scan.metadata, {name: t.shape for name, t in tensors.items()})
    check_routing_types(path, scan.value_types)
    layout = build_layout(path, tensors, hparams.n_layers, hparams.n_experts, hparams.n_embd, hparams.n_ff_exp)
    return ModelFile(path, _map(path), scan, hparams, tensors, layout)


def _tensor_infos(scan: HeaderScan, sizes: list[int]) -> dict[str, TensorInfo]:
    def info(t: RawTensor, nbytes: int) -> TensorInfo:
        return TensorInfo(t.name, ggml_type(t.type_id), tuple(reversed(t.ne)), scan.data_offset + t.rel_offset, nbytes)

    return {t.name: info(t, n) for t, n in zip(scan.tensors, sizes)}


def _map(path: Path) -> np.memmap:
    try:
        return np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise StrataFormatError(f"{path}: cannot memory-map the file: {e}") from e


def _check_gguf_py_agrees(path: Path, metadata: dict[str, Any], tensors: dict[str, TensorInfo]) -> None:
    try:
        reader = GGUFReader(path, "r")
        theirs_md = {k: f.contents() for k, f in reader.fields.items() if k not in _READER_PSEUDO_FIELDS}
    except Exception as e:  # the header walk passed, so anything here is a file gguf-py refuses
        raise StrataFormatError(f"{path}: gguf-py's reader refused the file: {type(e).__name__}: {e}") from e
    ours = [(t.name, t.offset, t.nbytes, t.ggml_type) for t in tensors.values()]
    theirs = [(t.name, int(t.data_offset), int(t.n_bytes), t.tensor_type) for t in reader.tensors]
    if ours != theirs:
        diff = next((a, b) for a, b in zip(ours + [None], theirs + [None]) if a != b)
        raise format_error(path, "tensor table", f"gguf-py's reader to agree with Strata ({diff[0]})", str(diff[1]))
    if _differs(metadata, theirs_md):
        key = next(k for k in {**metadata, **theirs_md} if _differs(metadata.get(k), theirs_md.get(k)))
        raise format_error(path, f"metadata key {key!r}", f"gguf-py's reader to agree with Strata "
                           f"({metadata.get(key)!r:.60})", f"{theirs_md.get(key)!r:.60}")


def _differs(a: Any, b: Any) -> bool:
    return a != b and repr(a) != repr(b)  # repr: a NaN value equals itself


class ModelFile:
    """A GGUF model file: metadata, hyperparameters, tensors, and a slab for every expert.

    Byte views returned by `tensor_data` / `expert_data` are numpy uint8 arrays over one
    read-only memory map of the file: no copy, no read until touched. Use as a context manager
    or call `close()`.
    """

    def __init__(self, path: Path, data: np.memmap, scan: HeaderScan, hparams: HParams,
                 tensors: dict[str, TensorInfo], layout: dict[int, ExpertLayer]):
        self.path = path
        self.version = scan.version
        self.alignment = scan.alignment
        self.file_size = scan.file_size
        self.metadata = scan.metadata
        self.hparams = hparams
        self.tensors = tensors
        self.resident = {name: t for name, t in tensors.items() if match_expert_tensor(name) is None}
        self.expert_layers = sorted(layout)
        self._layout = layout
        self._slabs: dict[tuple[int, int], tuple[ExpertSlab, ...]] = {}  # (layer, expert) -> its PARTS' slabs
        self._data: np.memmap | None = data

    @property
    def arch(self) -> str:
        return self.hparams.arch

    def __repr__(self) -> str:
        return (f"ModelFile({str(self.path)!r}, arch={self.arch!r}, tensors={len(self.tensors)}, "
                f"expert_layers={len(self.expert_layers)}, n_experts={self.hparams.n_experts})")

    # -- bytes ---------------------------------------------------------------------------------

    def _bytes(self, offset: int, nbytes: int) -> np.ndarray:
        if self._data is None:
            raise StrataError(f"{self.path}: the model file is closed")
        if offset < 0 or nbytes < 0 or offset + nbytes > self.file_size:
            raise ValueError(f"{self.path}: bytes [{offset}, {offset + nbytes}) are outside the file "
                             f"({self.file_size} bytes)")
        return self._data[offset:offset + nbytes]

    def check_intact(self) -> None:
        """Raise StrataError naming the file when it is shorter now than when it was opened.

        Touching a mapped page past the end of a truncated file kills the process (SIGBUS), so
        code that reads through the map in the decode loop calls this first (one fstat)."""
        if self._data is None:
            raise StrataError(f"{self.path}: the model file is closed")
        size = self._data._mmap.size()  # fstat of the mapped file itself, even if the path was replaced
        if size < self.file_size:
            raise StrataError(f"{self.path}: the file is now {size} bytes, it had {self.file_size} when opened "
                              "(truncated while in use?)")

    def tensor_data(self, name: str) -> np.ndarray:
        """The raw bytes of tensor `name` as a uint8 view of the memory map."""
        t = self.tensors[name]
        return self._bytes(t.offset, t.nbytes)

    def expert_data(self, slab: ExpertSlab) -> np.ndarray:
        """The raw bytes of an expert slab as a uint8 view of the memory map."""
        return self._bytes(slab.offset, slab.nbytes)

    # -- experts -------------------------------------------------------------------------------

    def expert(self, layer: int, expert: int, part: str) -> ExpertSlab:
        """The slab of `part` ("gate", "up" or "down") of routed expert `expert` in `layer`."""
        known = self._slabs.get((layer, expert))  # the pager's hot path: every load asks several times
        if known is not None and part in _PART_INDEX:
            return known[_PART_INDEX[part]]
        experts = self._layout.get(layer)
        if experts is None:
            raise ValueError(f"{self.path}: layer {layer} has no routed experts (expert layers: "
                             f"{self.expert_layers[:4]}{'...' if len(self.expert_layers) > 4 else ''})")
        if not 0 <= expert < experts.n_experts:
            raise ValueError(f"{self.path}: expert {expert} out of range [0, {experts.n_experts}) in layer {layer}")
        if part not in experts.parts:
            raise ValueError(f"{self.path}: expert part {part!r}: expected one of {PARTS}")
        return experts.parts[part].slab(layer, expert, part)

    def expert_slabs(self, layer: int, expert: int) -> tuple[ExpertSlab, ...]:
        """The gate, up and down slabs of one expert (kept: slabs are immutable)."""
        slabs = self._slabs.get((layer, expert))
        if slabs is None:
            slabs = self._slabs[(layer, expert)] = tuple(self.expert(layer, expert, part) for part in PARTS)
        return slabs

    def expert_region(self, layer: int, part: str) -> tuple[np.ndarray, int]:
        """(bytes, stride) holding `part` of every expert of `layer`: expert e's slab starts at
        byte e * stride of the uint8 view (the 3-D tensor, or its half of a fused gate_up one)."""
        first, last = self.expert(layer, 0, part), self.expert(layer, self.hparams.n_experts - 1, part)
        n = self.hparams.n_experts
        stride = (last.offset - first.offset) // (n - 1) if n > 1 else first.nbytes
        return self._bytes(first.offset, last.offset + last.nbytes - first.offset), stride

    def is_fused(self, layer: int) -> bool:
        """Whether `layer` stores gate and up in one ffn_gate_up_exps tensor (adjacent slabs)."""
        return self._layout[layer].fused

    # -- routing statistics --------------------------------------------------------------------

    def routing_counts(self) -> tuple[np.ndarray, int] | None:
        """(counts [L, E] float64 over `expert_layers`, n_tokens) from the file's `strata.routing.*`
        metadata (see `routing.py`); None when absent. Raises StrataFormatError when malformed."""
        return read_routing_counts(self.path, self.metadata, len(self.expert_layers), self.hparams.n_experts)

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Drop this object's hold on the file; unmap it (closing its descriptor) when no view
        handed out still uses the mapping, else those views keep it alive until they are freed."""
        mm = getattr(self._data, "_mmap", None)
        self._data = None
        # numpy holds no buffer export on the mapping, so closing it under a live view would leave
        # that view dangling: every view derives from a memmap holding `_mmap`, so count references.
        if mm is not None and sys.getrefcount(mm) == 2:  # `mm` here and getrefcount's argument
            mm.close()

    def __enter__(self) -> ModelFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- report --------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """A JSON-able description: hparams, bytes per ggml type, resident vs expert bytes, layers."""
        by_type: dict[str, dict[str, int]] = {}
        for t in self.tensors.values():
            entry = by_type.setdefault(t.ggml_type.name, {"tensors": 0, "bytes": 0})
            entry["tensors"] += 1
            entry["bytes"] += t.nbytes
        total = sum(t.nbytes for t in self.tensors.values())
        resident = sum(t.nbytes for t in self.resident.values())
        return {
            "path": str(self.path),
            "arch": self.arch,
            "gguf_version": self.version,
            "alignment": self.alignment,
            "file_bytes": self.file_size,
            "hparams": asdict(self.hparams),
            "n_metadata_keys": len(self.metadata),
            "n_tensors": len(self.tensors),
            "tensor_bytes": total,
            "types": dict(sorted(by_type.items())),
            "resident_bytes": resident,
            "expert_bytes": total - resident,
            "expert_layers": {str(layer): self._layer_summary(layer) for layer in self.expert_layers},
        }

    def _layer_summary(self, layer: int) -> dict[str, Any]:
        experts = self._layout[layer]
        slab_bytes = {part: g.nbytes for part, g in experts.parts.items()}
        per_expert = sum(slab_bytes.values())
        return {
            "n_experts": experts.n_experts,
            "fused_gate_up": experts.fused,
            "ggml_types": {part: g.ggml_type.name for part, g in experts.parts.items()},
            "slab_bytes": slab_bytes,
            "expert_bytes": per_expert,
            "layer_bytes": per_expert * experts.n_experts,
        }
