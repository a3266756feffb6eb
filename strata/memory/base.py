"""The expert-memory interface (`ExpertMemory`), the per-expert weights it hands out, and the one
mapping between model layer numbers and expert-layer indices (`ExpertLayers`).

Layer numbers. The `ExpertMemory` protocol speaks model layer numbers (what the model's blocks
are numbered); everything inside the memory package (policies, predictors, statistics, replay)
indexes expert layers 0..L-1, the layers that have routed experts, in order. `ExpertLayers` is
the only place that converts between the two. Nothing here allocates or moves bytes.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from strata.errors import StrataError


@dataclass(frozen=True)
class ExpertWeights:
    """One routed expert's SwiGLU matrices in the compute dtype on the compute device.

    D = n_embd, I = n_ff_exp; the expert computes down @ (silu(gate @ x) * (up @ x)).
    """

    gate: torch.Tensor  # [I, D]
    up: torch.Tensor  # [I, D]
    down: torch.Tensor  # [D, I]


@dataclass(frozen=True)
class PackedExperts:
    """Acquired experts in their file format, for the native MoE kernels: `parts` are the gate,
    up and down regions that hold them (`native.MoeParts`: a slot pool, or the file's expert
    tensors), `index[i]` is where the i-th acquired expert sits in those regions.

    With miss stand-ins (`strata.memory.standin`), an expert not in place (index -1) may come as
    its low-bit stand-in instead: `stand_in_index[i]` its position in `stand_in` (the stand-ins'
    regions), -1 for the experts of `index`; the caller computes those and waits for nothing."""

    parts: Any  # native.MoeParts
    index: list[int]
    stand_in: Any = None  # native.MoeParts of the stand-ins, or None: nothing stands in
    stand_in_index: list[int] | None = None


def check_acquire(held: tuple[int, tuple[int, ...]] | None, layer: int, ids: tuple[int, ...], max_acquire: int) -> None:
    """Refuse an acquire while another is `held` (layer, ids), or one of repeated experts or of
    more than `max_acquire` of them."""
    if held is not None:
        raise RuntimeError(f"acquire(layer={layer}) while layer {held[0]} experts {list(held[1])} "
                           "are still held: release them first")
    if len(ids) > max_acquire or len(set(ids)) != len(ids):
        raise ValueError(f"acquire of {list(ids)}: at most max_acquire={max_acquire} distinct experts at once")


@dataclass(frozen=True)
class HybridHost:
    """What hybrid compute reads of a memory (`ExpertMemory.hybrid`): its host tier (compact:
    experts read in place) and expert layers, the statistics it counts CPU experts in (under
    `lock`), `on_device(layer, expert)`: whether the expert is in or loading into a device slot,
    and `copies()`: (experts, seconds) so far of demand loads that were host hits only, the copy
    rate's evidence."""

    host: Any
    layers: Any
    stats: Any
    lock: Any
    on_device: Callable[[int, int], bool]
    copies: Callable[[], tuple[int, float]]


class Prefetcher(ABC):
    """A memory that takes hints (`ExpertMemory.prefetcher`): the model announces the experts of
    the next `prefetch_depth` MoE layers between layers (`strata.models.moe.Lookahead`)."""

    #: Layers ahead the model should announce with `prefetch` (> 0).
    prefetch_depth: int
    #: The learned map router look-ahead goes through (`strata.memory.predict.correction`), or None.
    lookahead_correction: Any = None

    @abstractmethod
    def prefetch(self, layer: int, expert_ids: Sequence[int], probs: Sequence[float] | None = None,
                 source: int | None = None) -> None:
        """Hint: `expert_ids` of `layer` are needed soon (with probabilities `probs`, default 1),
        predicted from the hidden state of model layer `source` (-1: the embeddings; None: unsaid).
        It never changes results and may be ignored."""

    def restrict(self, owned: dict[int, Any]) -> None:
        """Under expert parallelism: the only experts of each layer this memory will be asked for
        (owned[layer]: bool [E]); predictions of the others are not loaded. The default ignores it."""


class FixedExperts(ABC):
    """A packed memory whose experts stay in place between steps (`ExpertMemory.fixed`): read in
    place from the file, or a slot pool that never moves a loaded expert. A step may then compute
    from them without start and release (the decode program), reporting its routing with
    `served_fixed` / `served_fixed_layers`."""

    #: Whether `served_fixed` counts anything: a step computed from `fixed_packed` experts skips
    #: reporting its routing to a memory that says False.
    counts_routing: bool = True

    @abstractmethod
    def fixed_packed(self, layer: int) -> tuple[Any, torch.Tensor]:
        """Every packed expert of `layer`, for as long as the memory lives: (parts, slot_of),
        expert e being the matrix at position slot_of[e] (int32 [E]) of the parts (-1: not in
        place yet; the step hands that layer to the memory)."""

    def check_fixed(self) -> None:
        """Before each step computed from `fixed_packed` experts: raise if they can no longer be
        read (a file truncated under a read-in-place map). The default has nothing to check."""

    @abstractmethod
    def served_fixed(self, layer: int, expert_ids: torch.Tensor, n_used: int) -> None:
        """A step computed `layer`'s routing expert_ids [T, K] (n_used distinct experts) from
        `fixed_packed`: what `observe` and `start` would have counted."""

    def served_fixed_layers(self, layers: Sequence[int], expert_ids: torch.Tensor, n_used: Sequence[int]) -> None:
        """`served_fixed` of several layers of one step at once: expert_ids [len(layers), T, K],
        n_used one count per layer. The default calls `served_fixed` per layer; a memory may count
        them in one go (the decode program reports every layer of a token this way)."""
        for i, layer in enumerate(layers):
            self.served_fixed(layer, expert_ids[i], int(n_used[i]))


class ExpertMemory(ABC):
    """Where model code gets routed experts' weights from: residency.

    Protocol, per layer: `observe(layer, expert_ids)` reports the routing of the step, then
    `start(layer, expert_ids)` holds the experts in place and hands them out in the memory's
    `form`: "float", one `ExpertWeights` per id, all of them; "packed", `PackedExperts` (index -1
    for those still being read: compute the others meanwhile, then `finish(layer, expert_ids)`
    hands out the rest). They stay valid until `release(layer, expert_ids)`; at most `max_acquire`
    experts are held at once, so the caller starts them in chunks of that size. `acquire` is
    start and finish in one.

    What a memory offers beyond that it offers as attributes, None when it lacks it: `prefetcher`
    (it takes look-ahead hints), `fixed` (its packed experts stay in place between steps) and
    `hybrid` (a host tier the CPU may compute missed experts in).
    """

    device: torch.device
    dtype: torch.dtype
    max_acquire: int
    #: What `start` hands out: "float" (`ExpertWeights`) or "packed" (`PackedExperts`).
    form: str = "float"
    #: The memory's kind, as plans and statistics name it ("direct", "paged", "tiered").
    kind: str = "custom"
    #: Experts dequantized on a CUDA device (the GPU's dequantizer must read their types).
    cuda_slots: bool = False
    #: The tier that reads the disk (`strata.memory.host.HostTier`), or None: nothing is paged.
    disk_tier: Any = None
    #: The pools' slots per expert layer (`strata.memory.placement.Placement`), or None: no pools.
    placement: Any = None
    #: Look-ahead hints the memory takes, or None: it uses none.
    prefetcher: Prefetcher | None = None
    #: Packed experts that stay in place between steps, or None: any may move or be missing.
    fixed: FixedExperts | None = None
    #: Hybrid compute (CUDA, `TieredConfig.hybrid`): the host tier the runtime's CPU side computes
    #: missed experts in place from (strata.runtime.hybrid), or None.
    hybrid: HybridHost | None = None

    @abstractmethod
    def start(self, layer: int, expert_ids: Sequence[int]) -> list[ExpertWeights] | PackedExperts:
        """Hold `expert_ids` of `layer` and hand out those in place, in the order given (float
        form: every one)."""

    def finish(self, layer: int, expert_ids: Sequence[int]) -> PackedExperts:
        """Packed form: every expert `start` left pending (-1), now in place. Called only when
        `start` left one; the default leaves none."""
        raise RuntimeError(f"finish(layer={layer}, {list(expert_ids)}): {type(self).__name__}.start "
                           "leaves nothing pending")

    def acquire(self, layer: int, expert_ids: Sequence[int]) -> list[ExpertWeights] | PackedExperts:
        """`start`, then `finish` when something is pending: every expert in place."""
        held = self.start(layer, expert_ids)
        if self.form == "packed" and min(held.index, default=0) < 0:
            return self.finish(layer, expert_ids)
        return held

    @abstractmethod
    def release(self, layer: int, expert_ids: Sequence[int]) -> None:
        """Give back experts started with the same arguments; their weights may be reused."""

    def observe(self, layer: int, expert_ids: torch.Tensor) -> None:
        """The router of `layer` chose `expert_ids` [T, K] for this step (before `start`):
        routing statistics for placement and prediction. The default does nothing."""

    def memory_stats(self):
        """Counters of hits, misses, bytes and waits (`strata.memory.stats.MemoryStats`), or None."""
        return None

    def residency(self):
        """Which tier holds each expert now (`strata.memory.stats.Residency`), or None for a
        memory without pools (every expert read in place from the file)."""
        return None

    def close(self) -> None:
        """Free buffers and stop workers, if any."""


class LayerError(StrataError, ValueError):
    """A model layer that has no routed experts was asked for."""


class ExpertLayers:
    """Model layer numbers of the expert layers, in order: `index(layer)` is the expert-layer index
    0..L-1 of model layer `layer`, `layers[i]` (or `layer(i)`) the model layer of index i."""

    def __init__(self, layers: Sequence[int], where: object = "the model"):
        self.layers = [int(layer) for layer in layers]
        self.where = where  # named in errors: the model file's path
        self._index = {layer: i for i, layer in enumerate(self.layers)}
        self._rows: dict[tuple[int, ...], np.ndarray] = {}  # indices() of each run of layers asked for

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    def __getitem__(self, li: int) -> int:
        return self.layers[li]

    def index(self, layer: int) -> int:
        li = self._index.get(int(layer))
        if li is None:
            raise LayerError(f"{self.where}: layer {layer} has no routed experts (expert layers: {self.layers})")
        return li

    def layer(self, li: int) -> int:
        return self.layers[li]

    def indices(self, layers: Sequence[int]) -> np.ndarray:
        """`index` of each of `layers`, int64, kept per run of layers (a decode program records the
        same run step after step); the array is shared: do not write to it."""
        key = tuple(layers)
        rows = self._rows.get(key)
        if rows is None:
            rows = self._rows[key] = np.array([self.index(layer) for layer in key], dtype=np.int64)
        return rows


__all__ = ["ExpertLayers", "ExpertMemory", "ExpertWeights", "FixedExperts", "HybridHost", "LayerError", "PackedExperts",
           "Prefetcher", "check_acquire"]
