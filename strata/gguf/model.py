"""`ModelFile`: a validated, memory-mapped view of a GGUF model with one slab per expert.
Must not: import torch or interpret tensor values (it hands out bytes and shapes).
"""
from __future__ import annotations

import bisect
import sys
import weakref
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
from gguf.gguf_reader import GGUFReader

from strata.arch import layer_of
from strata.errors import StrataError, StrataFormatError
from strata.quant import ggml_type

from .experts import PARTS, ExpertLayer, build_layout, match_expert_tensor
from .header import HeaderScan, RawTensor, check_tensor_ranges, format_error, scan_header
from .hparams import HParams, read_hparams
from .records import ExpertSlab, FilePart, TensorInfo
from .routing import check_routing_types, read_routing_counts
from .split import part_bases, scan_parts

_PART_INDEX = {part: i for i, part in enumerate(PARTS)}

# Fields GGUFReader adds for the preamble; they are not metadata keys.
_READER_PSEUDO_FIELDS = frozenset({"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"})


class MapGuard(Protocol):
    """What guards a memory map against its file shrinking (`strata.native.MapGuard`): reads of
    its pages past the file's end give zeros, counted in `faults`, instead of a SIGBUS."""

    faults: int

    def close(self) -> None: ...


def open_model(path: str | Path, *, cross_check: bool = False,
               guard: Callable[[np.memmap], MapGuard] | None = None) -> ModelFile:
    """Open and validate the GGUF model at `path`; reads the headers only, never tensor data.

    `path` may be any part of a model split by llama.cpp's gguf-split (NAME-00002-of-00005.gguf):
    every part opens, and offsets are in the parts' common space (`strata.gguf.split`).
    Raises StrataFormatError naming the file and the offending key or tensor when a file is
    malformed, truncated, of an unsupported version or architecture, or contradicts itself, and
    naming the part when a split model's parts do not make one model.
    `cross_check=True` also parses every file with gguf-py's GGUFReader and requires it to agree
    on every metadata value and tensor record (seconds for a real tokenizer, so off by default).
    `guard`: called on each file's memory map (`strata.native.MapGuard`, as `strata.load` does) so
    that a file cut short while its tensors are read costs the reads zeros and `check_intact` an
    error, not the process a SIGBUS. Without it, call `check_intact` before reading in place.
    """
    path = Path(path)
    scans = scan_parts(path, scan_header(path))
    first_path, first = scans[0]
    bases = part_bases([scan.file_size for _, scan in scans])
    tensors: dict[str, TensorInfo] = {}
    parts = []
    for i, ((p, scan), base) in enumerate(zip(scans, bases)):
        infos = _tensor_infos(scan, check_tensor_ranges(p, scan), base)
        if cross_check:
            _check_gguf_py_agrees(p, scan.metadata, infos, base)
        tensors.update(infos)
        parts.append(FilePart(i, p, base, scan.file_size, tuple(infos)))
    hparams = read_hparams(first_path, first.metadata, {name: t.shape for name, t in tensors.items()})
    all_tensors = tensors
    tensors, parts = _trunk(tensors, parts, hparams)
    check_routing_types(first_path, first.value_types)
    layout = build_layout(first_path, tensors, hparams.n_layers, hparams.n_experts, hparams.n_embd, hparams.n_ff_exp)
    maps = [_map(part.path) for part in parts]
    nextn = {name: t for name, t in all_tensors.items() if name not in tensors}
    return ModelFile(tuple(parts), maps, first, hparams, tensors, layout, _guards(maps, guard), nextn)


def _trunk(tensors: dict[str, TensorInfo], parts: list[FilePart],
           hp: HParams) -> tuple[dict[str, TensorInfo], list[FilePart]]:
    """Without the multi-token-prediction blocks' tensors (`nextn_predict_layers` blocks after the
    trunk): the main forward does not run them, as llama.cpp's main graph does not (ModelFile.nextn
    keeps their records)."""
    mtp = range(hp.n_layers, hp.n_layers + hp.n_layers_nextn)
    if not mtp:
        return tensors, parts
    kept = {name: t for name, t in tensors.items() if layer_of(name) not in mtp}
    return kept, [replace(p, tensors=tuple(n for n in p.tensors if n in kept)) for p in parts]


def _tensor_infos(scan: HeaderScan, sizes: list[int], base: int = 0) -> dict[str, TensorInfo]:
    def info(t: RawTensor, nbytes: int) -> TensorInfo:
        offset = base + scan.data_offset + t.rel_offset
        return TensorInfo(t.name, ggml_type(t.type_id), tuple(reversed(t.ne)), offset, nbytes)

    return {t.name: info(t, n) for t, n in zip(scan.tensors, sizes)}


def _map(path: Path) -> np.memmap:
    try:
        return np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise StrataFormatError(f"{path}: cannot memory-map the file: {e}") from e


def _guards(maps: list[np.memmap], guard: Callable[[np.memmap], MapGuard] | None) -> list[MapGuard | None]:
    """A guard on each map, released when the map's mapping goes (`ModelFile.close`, or the last
    view of it): a guarded range must not outlive its mapping."""
    if guard is None:
        return [None] * len(maps)
    guards = [guard(m) for m in maps]
    for m, g in zip(maps, guards):
        weakref.finalize(m._mmap, g.close)
    return guards


def _cut_short(part: FilePart, size: int) -> StrataError:
    """The one error of a file that shrank under the model (its size now `size`)."""
    now = (f"it is now {size} bytes" if size < part.size else
           f"it is {size} bytes again, but parts of it were read while it was shorter")
    return StrataError(f"{part.path}: the file shrank while in use: {now}, it had {part.size} when opened; "
                       "load the model again")


def _check_gguf_py_agrees(path: Path, metadata: dict[str, Any], tensors: dict[str, TensorInfo], base: int) -> None:
    try:
        reader = GGUFReader(path, "r")
        theirs_md = {k: f.contents() for k, f in reader.fields.items() if k not in _READER_PSEUDO_FIELDS}
    except Exception as e:  # the header walk passed, so anything here is a file gguf-py refuses
        raise StrataFormatError(f"{path}: gguf-py's reader refused the file: {type(e).__name__}: {e}") from e
    ours = [(t.name, t.offset - base, t.nbytes, t.ggml_type) for t in tensors.values()]
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
    """A GGUF model: metadata, hyperparameters, tensors, and a slab for every expert.

    Byte views returned by `tensor_data` / `expert_data` are numpy uint8 arrays over read-only
    memory maps of the file (one per part of a split model): no copy, no read until touched.
    `parts` lists the files; offsets are in their common space (`strata.gguf.split`), so a model
    in one file has one part at base 0 and offsets are file offsets. Use as a context manager or
    call `close()`.
    """

    def __init__(self, parts: tuple[FilePart, ...], maps: list[np.memmap], scan: HeaderScan, hparams: HParams,
                 tensors: dict[str, TensorInfo], layout: dict[int, ExpertLayer],
                 guards: list[MapGuard | None] | None = None, nextn: dict[str, TensorInfo] | None = None):
        self.parts = parts
        self.path = parts[0].path  # the file holding the metadata (the first part)
        self.version = scan.version
        self.alignment = scan.alignment
        self.file_size = parts[-1].base + parts[-1].size  # the end of the offsets
        self.metadata = scan.metadata
        self.hparams = hparams
        self.tensors = tensors
        # the multi-token-prediction blocks' tensors (after the trunk): kept for speculative decoding, not run
        self.nextn = dict(nextn or {})
        self.resident = {name: t for name, t in tensors.items() if match_expert_tensor(name) is None}
        self.expert_layers = sorted(layout)
        self._layout = layout
        self._slabs: dict[tuple[int, int], tuple[ExpertSlab, ...]] = {}  # (layer, expert) -> its PARTS' slabs
        self._maps: list[np.memmap] | None = maps
        self._guards = guards or [None] * len(maps)
        self._bases = [part.base for part in parts]

    @property
    def arch(self) -> str:
        return self.hparams.arch

    def __repr__(self) -> str:
        return (f"ModelFile({str(self.path)!r}, arch={self.arch!r}, tensors={len(self.tensors)}, "
                f"expert_layers={len(self.expert_layers)}, n_experts={self.hparams.n_experts})")

    # -- bytes ---------------------------------------------------------------------------------

    def part_of(self, offset: int) -> FilePart:
        """The file holding the model's byte `offset` (for a split model, the part whose range starts
        at or below it)."""
        return self.parts[max(0, bisect.bisect_right(self._bases, offset) - 1)]

    def _bytes(self, offset: int, nbytes: int) -> np.ndarray:
        if self._maps is None:
            raise StrataError(f"{self.path}: the model file is closed")
        part = self.part_of(offset)
        start = offset - part.base
        if start < 0 or nbytes < 0 or start + nbytes > part.size:
            where = (f"the file ({part.size} bytes)" if len(self.parts) == 1 else
                     f"one part ({part.path.name} holds [{part.base}, {part.base + part.size}))")
            raise ValueError(f"{part.path}: bytes [{offset}, {offset + nbytes}) are outside {where}")
        return self._maps[part.index][start:start + nbytes]

    def check_intact(self) -> None:
        """Raise StrataError naming the file when it (or a part) is shorter now than when opened,
        or when a guarded map read pages past its end (they read zeros, now and later).

        Touching a mapped page past the end of a truncated file kills the process (SIGBUS) unless
        the map is guarded, so code that reads through the map in the decode loop calls this before
        (one fstat per file) and, guarded, after its reads: a file cut short between the two fails
        the work that read zeros."""
        if self._maps is None:
            raise StrataError(f"{self.path}: the model file is closed")
        for part, data, guard in zip(self.parts, self._maps, self._guards):
            size = data._mmap.size()  # fstat of the mapped file itself, even if the path was replaced
            if size < part.size or (guard is not None and guard.faults):
                raise _cut_short(part, size)

    def tensor_data(self, name: str) -> np.ndarray:
        """The raw bytes of tensor `name` (a trunk or an MTP block's) as a uint8 view of the memory map."""
        t = self.tensors[name] if name in self.tensors else self.nextn[name]
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
        """Drop this object's hold on the files; unmap each (closing its descriptor) when no view
        handed out still uses its mapping, else those views keep it alive until they are freed."""
        maps, self._maps = self._maps or [], None
        guards, self._guards = self._guards, [None] * len(self.parts)
        while maps:
            # numpy holds no buffer export on the mapping, so closing it under a live view would leave
            # that view dangling: every view derives from a memmap holding `_mmap`, so count references.
            mm, guard = getattr(maps.pop(), "_mmap", None), guards.pop()
            if mm is not None and sys.getrefcount(mm) == 2:  # `mm` here and getrefcount's argument
                if guard is not None:
                    guard.close()  # before the range is unmapped; else when the last view goes
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
            "file_bytes": sum(part.size for part in self.parts),
            "hparams": asdict(self.hparams),
            "n_metadata_keys": len(self.metadata),
            "n_tensors": len(self.tensors),
            "tensor_bytes": total,
            "types": dict(sorted(by_type.items())),
            "resident_bytes": resident,
            "expert_bytes": total - resident,
            "parts": [self._part_summary(part) for part in self.parts],
            "expert_layers": {str(layer): self._layer_summary(layer) for layer in self.expert_layers},
        }

    def _part_summary(self, part: FilePart) -> dict[str, Any]:
        """One file: its number (1-based, as in its name), path, size and what it holds."""
        names = part.tensors
        layers = sorted({self._layer_of(name) for name in names} - {None})
        return {"part": part.index + 1, "path": str(part.path), "file_bytes": part.size, "n_tensors": len(names),
                "tensor_bytes": sum(self.tensors[name].nbytes for name in names),
                "expert_tensors": sum(self._layer_of(name) is not None for name in names), "expert_layers": layers}

    @staticmethod
    def _layer_of(name: str) -> int | None:
        hit = match_expert_tensor(name)
        return None if hit is None else hit[1]

    def _layer_summary(self, layer: int) -> dict[str, Any]:
        experts = self._layout[layer]
        slab_bytes = {part: g.nbytes for part, g in experts.parts.items()}
        per_expert = sum(slab_bytes.values())
        out = {
            "n_experts": experts.n_experts,
            "fused_gate_up": experts.fused,
            "ggml_types": {part: g.ggml_type.name for part, g in experts.parts.items()},
            "slab_bytes": slab_bytes,
            "expert_bytes": per_expert,
            "layer_bytes": per_expert * experts.n_experts,
        }
        if len(self.parts) > 1:  # the file part (1-based, as in its name) holding each of gate, up, down
            out["in_part"] = {part: self.part_of(g.base).index + 1 for part, g in experts.parts.items()}
        return out
