"""Low-bit stand-ins for missed experts: a resident copy of every routed expert in a small type.

    stand_ins = StandIns(model_file, "q2_k", layers)    # built at load, held in RAM
    stand_ins.parts(layer)                             # native.MoeParts: expert e at position e

At load the stand-ins stored beside the file (`MODEL.standins.gguf`, written by `strata convert
--add-stand-ins TYPE` or `--stand-ins TYPE`) are copied when they are of `TYPE`; otherwise every
routed expert of the file is dequantized and quantized again into `TYPE` (Q2_K: 2.6 bits a
weight, against 4.5 for Q4_K), or copied when the file already stores it so. The
paged memory counts these bytes in its budget and, on a miss, hands the expert's stand-in to the
compute instead of making it wait for the full expert's read (HOBBIT's idea): in "background"
mode the full expert is still read, without waiting, so its next use hits, when a slot is free or
it is used more often than the expert it would evict; in "instead" mode it is read only into a
free slot (the slots fill once and then stay: no eviction, no more reads).

Only types the native runtime both quantizes and multiplies packed are stand-in types.
Must not compute: it moves and converts bytes (the native quantizers do the arithmetic).
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from strata import native
from strata.errors import StrataError
from strata.gguf import PARTS, ModelFile
from strata.gguf.standins import StoredStandIns, open_stand_ins
from strata.quant import GGMLType, block_size, ggml_type, row_bytes

#: How a miss is served when stand-ins are on: the full expert read in the background (its next
#: use hits), or never read (the stand-in serves every use of an expert not placed at start-up).
STAND_IN_MODES = ("background", "instead")
DEFAULT_STAND_IN_MODE = "background"


class StandInError(StrataError, ValueError):
    """A stand-in type or mode that cannot be used."""


def stand_in_types() -> list[str]:
    """Type names the native runtime both quantizes into and multiplies packed."""
    return [t.name.lower() for t in GGMLType if native.can_quantize(t) and native.type_support(t).packed]


def stand_in_type(name) -> GGMLType:
    """The stand-in type named `name` ('q2_k'), or a one-line StandInError naming it."""
    try:
        t = ggml_type(name)
    except ValueError:
        t = None
    if t is None or t.name.lower() not in stand_in_types():
        raise StandInError(f"miss stand-in type {name!r}: expected one of {', '.join(stand_in_types())} "
                           "(types the native runtime quantizes and multiplies packed)")
    return t


def check_stand_in_mode(mode: str) -> str:
    if mode not in STAND_IN_MODES:
        raise StandInError(f"stand-in mode {mode!r}: expected one of {', '.join(STAND_IN_MODES)}")
    return mode


class StandIns:
    """Every routed expert of `layers` of `model_file` in type `t`, one array per (layer, part):
    uint8 [E, matrix bytes], expert e's matrix at row e. Copied from the stand-ins stored beside
    the file (`strata.gguf.standins`) when they are of type `t`, built otherwise.
    n_threads: the quantizer's. `stored`: where the copies came from (the sidecar, or None)."""

    def __init__(self, model_file: ModelFile, t, layers, n_threads: int = 1):
        self.type = stand_in_type(t)
        self.model_file, self.n_threads = model_file, n_threads
        self.n_experts = model_file.hparams.n_experts
        stored = open_stand_ins(model_file)
        self.stored = stored.path if stored is not None and stored.type == self.type else None
        self._parts: dict[int, native.MoeParts] = {}
        self.nbytes = 0
        for layer in layers:
            self._parts[layer] = native.MoeParts(*(self._part(layer, part, stored if self.stored else None)
                                                   for part in PARTS))

    def __repr__(self) -> str:
        return f"StandIns({self.type.name}, {len(self._parts)} layers x {self.n_experts} experts, {self.nbytes} B)"

    def parts(self, layer: int) -> native.MoeParts:
        """The stand-ins of `layer` as the native MoE kernels' regions (expert e at position e)."""
        return self._parts[layer]

    def _part(self, layer: int, part: str, stored: StoredStandIns | None) -> native.MoePart:
        n_rows, row_len = check_rows(self.model_file, self.type, layer, part)
        size = n_rows * row_bytes(self.type, row_len)
        if stored is not None:
            out = np.array(stored.region(layer, part, self.n_experts, n_rows, row_len, size))  # resident copy
        else:
            out = np.empty((self.n_experts, size), dtype=np.uint8)  # [E, bytes]
            for e, data in enumerate(requantized(self.model_file, self.type, layer, part, self.n_threads)):
                out[e] = data
        self.nbytes += out.nbytes
        return native.MoePart(out.reshape(-1), self.type, n_rows, row_len)


def stand_in_bytes(model_file: ModelFile, t: GGMLType, layers) -> int:
    """Bytes the stand-ins of `layers` in type `t` take, from the file's shapes (nothing built)."""
    n = 0
    for layer in layers:
        for part in PARTS:
            n_rows, row_len = check_rows(model_file, t, layer, part)
            n += model_file.hparams.n_experts * n_rows * row_bytes(t, row_len)
    return n


def check_rows(model_file: ModelFile, t: GGMLType, layer: int, part: str) -> tuple[int, int]:
    """(rows, row length) of `part`'s expert matrices in `layer`, or a StandInError when their rows
    are not whole blocks of `t`."""
    first = model_file.expert(layer, 0, part)
    n_rows, row_len = first.shape
    if row_len % block_size(t)[0]:
        raise StandInError(f"{model_file.path}: {first.tensor} (layer {layer}, {part}): rows of {row_len} values "
                           f"are not whole {t.name} blocks of {block_size(t)[0]}; pick another --miss-stand-in type")
    return n_rows, row_len


def requantized(model_file: ModelFile, t: GGMLType, layer: int, part: str, n_threads: int = 1) -> Iterator[np.ndarray]:
    """Expert by expert, `part` of `layer` in type `t`: uint8 [matrix bytes] (one buffer, reused:
    copy it before the next one). Experts already of type `t` come as their file bytes."""
    n_rows, row_len = check_rows(model_file, t, layer, part)
    data, stride = model_file.expert_region(layer, part)
    out = np.empty(n_rows * row_bytes(t, row_len), dtype=np.uint8)
    values = np.empty((n_rows, row_len), dtype=np.float32)  # [rows, row_len]: one matrix at a time
    for e in range(model_file.hparams.n_experts):
        slab = model_file.expert(layer, e, part)
        src = data[e * stride:e * stride + slab.nbytes]
        if slab.ggml_type == t:  # already the stand-in's type: the bytes as they are
            yield src
            continue
        native.dequantize_into(slab.ggml_type, src, values, n_threads=n_threads)
        native.quantize_into(t, values, out, n_threads=n_threads)
        yield out


__all__ = ["DEFAULT_STAND_IN_MODE", "STAND_IN_MODES", "StandInError", "StandIns", "check_rows", "check_stand_in_mode",
           "requantized", "stand_in_bytes", "stand_in_type", "stand_in_types"]
