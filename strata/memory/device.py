"""Device tier: a fixed pool of expert slots on the compute device (VRAM, or RAM on the CPU).

    slots = DeviceSlots(geometry, n_slots=64, form="dequantized", device="cuda", dtype=torch.bfloat16)
    seconds = slots.fill(slot, host_expert)       # host slot bytes -> device slot
    slots.wait_ready(slot)                        # the compute stream waits for that fill only
    w = slots.weights(slot, slabs, index=0)       # ExpertWeights for the model
    slots.release(slot)                           # the slot may be overwritten after this compute

Every buffer is allocated in the constructor; afterwards a fill only overwrites a slot.

Slot forms (S slots, I = n_ff_exp, D = n_embd, A = scratch experts):

    dequantized  gate [S, I, D], up [S, I, D], down [S, D, I] in the compute dtype: a hit is a
                 pure GEMM. Filled on the CPU by the native kernels from the host slot; on CUDA
                 the packed bytes cross PCIe (3.5-7x fewer than the values) into one of two
                 staging buffers and are dequantized on the device (`strata.quant_torch`) into the slot.
    packed       uint8 [S, slot_bytes]: the GGUF bytes of gate | up | down, each region
                 PACKED_ALIGN-aligned. 3.5-7x more experts per byte of budget; each use
                 dequantizes into scratch gate/up [A, I, D], down [A, D, I] (native kernels on
                 the CPU, `strata.quant_torch` on CUDA).

CUDA ordering. All fills run on one load stream. Each slot has two events: `ready` (recorded
after its fill; the compute stream waits on it before reading the slot) and `free` (recorded on
the compute stream at release; the load stream waits on it before overwriting the slot). The
compute stream never waits for a load it does not read. On the CPU fills are synchronous and
the events are not used.

Must not decide placement (the policies do) or read the model file (host bytes are handed in).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from strata import native, quant_torch
from strata.gguf import PARTS, ExpertSlab, ModelFile
from strata.units import itemsize, round_up

from . import alloc
from .base import ExpertWeights
from .direct import MIN_ELEMS_PER_THREAD

SLOT_FORMS = ("dequantized", "packed")
#: Start of each part's region in a packed slot (bytes): whole cache lines and GPU sectors.
PACKED_ALIGN = 256


@dataclass(frozen=True)
class ExpertGeometry:
    """Shapes of an expert's parts and the largest packed size of each over the expert layers."""

    shapes: tuple[tuple[int, int], tuple[int, int], tuple[int, int]]  # gate [I, D], up [I, D], down [D, I]
    packed: tuple[int, int, int]  # bytes

    @property
    def packed_offsets(self) -> tuple[int, int, int]:
        """Start of each part in a packed slot."""
        a = [round_up(n, PACKED_ALIGN) for n in self.packed]
        return (0, a[0], a[0] + a[1])

    @property
    def packed_slot_bytes(self) -> int:
        return sum(round_up(n, PACKED_ALIGN) for n in self.packed)

    def values(self) -> int:
        """Elements of one expert (gate + up + down)."""
        return sum(r * c for r, c in self.shapes)

    def slot_bytes(self, form: str, dtype: torch.dtype) -> int:
        """Bytes of one slot of `form`."""
        check_form(form)
        return self.packed_slot_bytes if form == "packed" else self.values() * itemsize(dtype)


def largest_slabs(model: ModelFile) -> tuple[int, int, int]:
    """Bytes of the largest gate, up and down slab over the expert layers (every expert of a layer
    has the same size, so expert 0 stands for its layer): what a slot of either tier must hold."""
    gate, up, down = (max(model.expert(layer, 0, part).nbytes for layer in model.expert_layers) for part in PARTS)
    return gate, up, down


def expert_geometry(model: ModelFile) -> ExpertGeometry:
    """The expert geometry of `model`; every expert layer must share the part shapes."""
    first = model.expert_slabs(model.expert_layers[0], 0)
    shapes = tuple(s.shape for s in first)
    for layer in model.expert_layers:
        for p, slab in enumerate(model.expert_slabs(layer, 0)):
            if slab.shape != shapes[p]:
                raise ValueError(f"{model.path}: {slab.tensor}: expert {slab.part} shape {list(slab.shape)} differs "
                                 f"from layer {model.expert_layers[0]}'s {list(shapes[p])}; device slots need one "
                                 f"shape per part")
    return ExpertGeometry(shapes, largest_slabs(model))


def check_form(form: str) -> str:
    if form not in SLOT_FORMS:
        raise ValueError(f"slot form must be one of {', '.join(SLOT_FORMS)}, found {form!r}")
    return form


class DeviceSlots:
    """`n_slots` expert slots of `form` on `device`, plus `n_scratch` dequantized experts of
    scratch (packed form) or two staging buffers (dequantized form on CUDA). See the module
    docstring for layouts and CUDA ordering."""

    def __init__(self, geometry: ExpertGeometry, n_slots: int, form: str, device: torch.device | str,
                 dtype: torch.dtype, n_scratch: int = 0, n_threads: int = 1):
        self.geometry, self.n_slots, self.form = geometry, int(n_slots), check_form(form)
        self.device, self.dtype, self.n_threads = torch.device(device), dtype, n_threads
        self.cuda = self.device.type == "cuda"
        shapes = geometry.shapes
        if self.form == "dequantized":
            self.parts = [alloc.empty((self.n_slots, *shapes[p]), dtype, self.device, f"device slots {part}")
                          for p, part in enumerate(PARTS)]  # [S, I, D], [S, I, D], [S, D, I]
            self.scratch: list[torch.Tensor] = []
        else:
            self.packed = alloc.empty((self.n_slots, geometry.packed_slot_bytes), torch.uint8, self.device,
                                      "device slots packed")  # [S, slot_bytes]
            self._packed_np = None if self.cuda else self.packed.numpy()
            self.scratch = [alloc.empty((n_scratch, *shapes[p]), dtype, self.device, f"scratch {part}")
                            for p, part in enumerate(PARTS)] if n_scratch > 0 else []  # [A, I, D], [A, I, D], [A, D, I]
        if self.cuda:
            self.load_stream = torch.cuda.Stream(self.device)
            self.ready = [torch.cuda.Event() for _ in range(self.n_slots)]
            self.free = [torch.cuda.Event() for _ in range(self.n_slots)]
            self.staging = ([alloc.empty((max(geometry.packed),), torch.uint8, self.device, "device staging")
                             for _ in range(2)] if self.form == "dequantized" else [])
            self._next_staging = 0
            self._fill_lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes of the slots, scratch and staging."""
        tensors = ([*self.parts] if self.form == "dequantized" else [self.packed]) + self.scratch
        tensors += getattr(self, "staging", [])
        return sum(t.numel() * t.element_size() for t in tensors)

    # ---- fills ---------------------------------------------------------------------------------

    def fill(self, slot: int, slabs: Sequence[ExpertSlab], parts: Sequence[np.ndarray]) -> tuple[float, int]:
        """Write one expert (its three slabs, packed bytes `parts` in host memory) into `slot`.
        Returns (seconds spent dequantizing, bytes written). On CUDA the writes are queued on the
        load stream and `ready[slot]` is recorded after them; the host bytes must stay put until
        that event completes."""
        if self.cuda:
            return self._fill_cuda(slot, slabs, parts)
        t0 = time.perf_counter()
        written = 0
        for p, (slab, src) in enumerate(zip(slabs, parts)):
            if self.form == "dequantized":
                out = self.parts[p][slot]
                native.dequantize_into(slab.ggml_type, src, out, n_threads=self._threads(out.numel()))
                written += out.numel() * out.element_size()
            else:
                start = self.geometry.packed_offsets[p]
                np.copyto(self._packed_np[slot, start:start + slab.nbytes], src)
                written += slab.nbytes
        seconds = time.perf_counter() - t0
        return (seconds if self.form == "dequantized" else 0.0), written

    def _fill_cuda(self, slot: int, slabs: Sequence[ExpertSlab], parts: Sequence[np.ndarray]) -> tuple[float, int]:
        t0 = time.perf_counter()
        written = 0
        # One fill queued at a time (loader and compute threads both fill): a staging buffer is
        # reused only after the dequantization that reads it has been queued behind it.
        with self._fill_lock, torch.cuda.stream(self.load_stream):
            self.load_stream.wait_event(self.free[slot])  # the last compute that read this slot
            for p, (slab, src) in enumerate(zip(slabs, parts)):
                host = torch.from_numpy(src)  # a view of the pinned host slot, no copy
                if self.form == "packed":
                    start = self.geometry.packed_offsets[p]
                    self.packed[slot, start:start + slab.nbytes].copy_(host, non_blocking=True)
                    written += slab.nbytes
                else:
                    stage = self.staging[self._next_staging][:slab.nbytes]
                    self._next_staging ^= 1  # alternate: one stages while the other is read
                    stage.copy_(host, non_blocking=True)
                    out = self.parts[p][slot]
                    quant_torch.dequantize_into(slab.ggml_type, stage, out)
                    written += out.numel() * out.element_size()
            self.ready[slot].record(self.load_stream)
        seconds = time.perf_counter() - t0
        return (seconds if self.form == "dequantized" else 0.0), written

    def fill_done(self, slot: int) -> bool:
        """True when the last fill of `slot` has finished (always on the CPU)."""
        return not self.cuda or self.ready[slot].query()

    def sync_fill(self, slot: int) -> None:
        """Block the calling thread until the last fill of `slot` has finished."""
        if self.cuda:
            self.ready[slot].synchronize()

    # ---- use -----------------------------------------------------------------------------------

    def wait_ready(self, slot: int) -> None:
        """Make the compute stream wait for the last fill of `slot` (a no-op on the CPU)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(self.ready[slot])

    def weights(self, slot: int, slabs: Sequence[ExpertSlab], index: int) -> tuple[ExpertWeights, float]:
        """The expert in `slot` as ExpertWeights, and seconds spent dequantizing it. The packed
        form dequantizes into scratch expert `index` (valid until the next use of that index)."""
        if self.form == "dequantized":
            return ExpertWeights(*(part[slot] for part in self.parts)), 0.0
        t0 = time.perf_counter()
        for p, slab in enumerate(slabs):
            start = self.geometry.packed_offsets[p]
            src, out = self.packed[slot, start:start + slab.nbytes], self.scratch[p][index]
            if self.cuda:
                quant_torch.dequantize_into(slab.ggml_type, src, out)
            else:
                native.dequantize_into(slab.ggml_type, src, out, n_threads=self._threads(out.numel()))
        return ExpertWeights(*(s[index] for s in self.scratch)), time.perf_counter() - t0

    def release(self, slot: int) -> None:
        """Compute queued so far is the last to read `slot` before it may be refilled."""
        if self.cuda:
            self.free[slot].record(torch.cuda.current_stream(self.device))

    def _threads(self, n_elems: int) -> int:
        return min(self.n_threads, max(1, n_elems // MIN_ELEMS_PER_THREAD))


__all__ = ["DeviceSlots", "ExpertGeometry", "PACKED_ALIGN", "SLOT_FORMS", "check_form", "expert_geometry"]
