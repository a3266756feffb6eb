"""`DirectExpertMemory`: experts straight from the memory-mapped file, no cache.

The simplest memory behind the `ExpertMemory` interface and the baseline tiered memory is held
to. Float form: every `start` reads the experts' slabs through the file's memory map and
dequantizes them with the native runtime into buffers allocated once at start (pinned when the
device is CUDA, then copied to device buffers). Packed form (`packed=True`, the CPU's packed
compute): `start` hands out the file's own expert tensors, so the native MoE kernels read the
mapped bytes in place (as llama.cpp does with a mapped file), and they are the memory's `fixed`
experts. Nothing is allocated per call.
Both forms check that the file still has its size before each layer's experts are touched, which
costs one fstat per layer; a file cut short after that check costs the reads zero pages, not a
SIGBUS (`strata.load` guards the map), and the engine's check after the step fails it.
Must not: cache, place or prefetch (that is the tiered memory's job).
"""
from __future__ import annotations

from functools import partial
from typing import Sequence

import torch

from strata import native
from strata.gguf import PARTS, ModelFile
from strata.units import itemsize

from .base import ExpertMemory, ExpertWeights, FixedExperts, PackedExperts
from .parts import LayerParts, file_parts

#: Default bytes of expert buffers (per copy: host, and device when not CPU); sets `max_acquire`.
DEFAULT_BUFFER_BYTES = 256 << 20
#: Elements one dequantization thread gets at least: below ~1 MB of output, starting a thread
#: costs more than it saves (small models' slabs would otherwise spawn a thread per core per call).
MIN_ELEMS_PER_THREAD = 1 << 18


class DirectExpertMemory(ExpertMemory, FixedExperts):
    """Experts dequantized from `model_file` on every `start` into `max_acquire` fixed buffers, or
    (`packed`) read in place from the mapped file, where they stay (`fixed`)."""

    kind = "direct"

    def __init__(self, model_file: ModelFile, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, n_threads: int | None = None,
                 max_acquire: int | None = None, packed: bool = False):
        self.model_file, self.packed = model_file, packed
        self.form = "packed" if packed else "float"
        self.device, self.dtype = torch.device(device), dtype
        self.n_threads = n_threads or native.default_threads()
        hp = model_file.hparams
        if not model_file.expert_layers:
            raise ValueError(f"{model_file.path}: the model has no routed experts")
        self.shapes = {s.part: s.shape for s in model_file.expert_slabs(model_file.expert_layers[0], 0)}
        if packed:
            if self.device.type != "cpu":
                raise ValueError(f"packed experts are computed on the CPU, not on {self.device}")
            self.max_acquire, self._held = hp.n_experts, None
            self._parts = LayerParts(partial(file_parts, model_file))
            return
        per_expert = sum(r * c for r, c in self.shapes.values()) * itemsize(dtype)
        default = min(hp.n_experts, max(hp.n_experts_used, DEFAULT_BUFFER_BYTES // per_expert))
        self.max_acquire = max_acquire or default
        if not 1 <= self.max_acquire <= hp.n_experts:
            raise ValueError(f"max_acquire must be between 1 and n_experts={hp.n_experts}, found {self.max_acquire}")
        pin = self.device.type == "cuda"
        self._host = [self._buffers("cpu", pin) for _ in range(self.max_acquire)]
        self._device = self._host if self.device.type == "cpu" else [
            self._buffers(self.device, False) for _ in range(self.max_acquire)]
        self._held: tuple[int, tuple[int, ...]] | None = None

    def __repr__(self) -> str:
        where = "packed, read in place from the mapped file" if self.packed else \
            f"dequantized at each use into {self.max_acquire} buffers"
        return f"DirectExpertMemory({self.model_file.path.name}, {self.device}, {where})"

    def _buffers(self, device: str | torch.device, pin: bool) -> dict[str, torch.Tensor]:
        return {part: torch.empty(self.shapes[part], dtype=self.dtype, device=device, pin_memory=pin)
                for part in PARTS}

    def start(self, layer: int, expert_ids: Sequence[int]) -> list[ExpertWeights] | PackedExperts:
        """Every expert at once (nothing is ever pending): float weights dequantized into the
        buffers, or (packed) the file's expert tensors and the experts' positions in them."""
        ids = tuple(int(e) for e in expert_ids)
        if self._held is not None:
            raise RuntimeError(f"acquire(layer={layer}) while layer {self._held[0]} experts {list(self._held[1])} "
                               "are still held: release them first")
        if len(ids) > self.max_acquire:
            raise ValueError(f"acquire of {len(ids)} experts, at most max_acquire={self.max_acquire} at once")
        self.model_file.check_intact()  # a truncated file would SIGBUS the reads below (packed: the kernels')
        out = PackedExperts(self._parts(layer), list(ids)) if self.packed else \
            [self._load(layer, e, i) for i, e in enumerate(ids)]
        self._held = (layer, ids)
        return out

    # ---- fixed experts (packed) --------------------------------------------------------------

    @property
    def fixed(self) -> FixedExperts | None:
        return self if self.packed else None  # a property: the memory keeps no reference to itself

    def fixed_packed(self, layer: int) -> tuple[native.MoeParts, torch.Tensor]:
        """The file's expert tensors, expert e at position e (the map never moves)."""
        self.model_file.check_intact()
        parts = self._parts(layer)
        return parts, torch.arange(parts.gate.n_experts, dtype=torch.int32)

    def check_fixed(self) -> None:
        self.model_file.check_intact()  # the program reads the experts in place from the map

    def served_fixed(self, layer: int, expert_ids: torch.Tensor, n_used: int) -> None:
        self.observe(layer, expert_ids)  # nothing counted but what `observe` counts

    def _load(self, layer: int, expert: int, index: int) -> ExpertWeights:
        host, dev = self._host[index], self._device[index]
        for slab in self.model_file.expert_slabs(layer, expert):
            buf = host[slab.part]
            if tuple(buf.shape) != slab.shape:
                raise ValueError(f"{self.model_file.path}: {slab.tensor} expert {expert}: expected slab shape "
                                 f"{tuple(buf.shape)}, found {slab.shape}")
            n_threads = min(self.n_threads, max(1, buf.numel() // MIN_ELEMS_PER_THREAD))
            native.dequantize_into(slab.ggml_type, self.model_file.expert_data(slab), buf, n_threads=n_threads)
            if dev is not host:
                dev[slab.part].copy_(buf)  # synchronous: the host buffer is reused by the next acquire
        return ExpertWeights(gate=dev["gate"], up=dev["up"], down=dev["down"])

    def release(self, layer: int, expert_ids: Sequence[int]) -> None:
        ids = tuple(int(e) for e in expert_ids)
        if self._held != (layer, ids):
            raise RuntimeError(f"release(layer={layer}, {list(ids)}) does not match what is held: {self._held}")
        self._held = None

    def close(self) -> None:
        self._host, self._device, self._held = [], [], None


__all__ = ["DEFAULT_BUFFER_BYTES", "MIN_ELEMS_PER_THREAD", "DirectExpertMemory", "file_parts"]
