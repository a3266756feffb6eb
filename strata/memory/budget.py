"""Every default and check of the expert memory's budgets and prefetch settings, in one place:
`TieredConfig`, parsing, the host slot layout, and
the plan that turns budgets into slot counts. Plain arithmetic; nothing is allocated here.

The machine's memory (a cgroup limit included) is measured in one place, `machine.py`, once per
load; the budgets here take its record (`Machine`) as an argument and never measure.

Device budget (`device_mem`): every byte the model may use on the compute device (VRAM on CUDA,
RAM on the CPU device): resident weights and KV cache (`reserved`), the expert slot pool, and
the packed form's scratch (or CUDA staging). Default: on CUDA the free memory less a headroom
for activations; on the CPU DEFAULT_CPU_DEVICE_FRACTION of available memory. Either way no more
than every expert needs.

Host budget (`host_mem`): the host tier's pool of packed experts. Default: the host tier's
minimum (top-k slots per layer) when the device holds every expert, else DEFAULT_HOST_FRACTION
of available memory, no more than every expert needs. A quarter, as decoding has used since the
tiered memory came (README); with the CPU device's quarter the defaults take half of what is
available and leave the rest to the page cache the pager and the resident weights read through.

Slot form default: `dequantized` when every expert fits the device budget dequantized, else
`packed`, on both devices. A dequantized hit is a bare GEMM, but the packed form holds 7x
(float32; 3.5x in bfloat16) more experts in the same bytes, and once the pool holds a small share
of the experts the misses it saves outweigh the dequantization at every use (benchmarks/
tiered_forms.py; its figures: benchmarks/RESULTS.md, "Tiered memory on the CPU"). On CUDA the
same rule holds a fortiori (the GPU dequantizes a slot far faster than PCIe refills one); run
benchmarks/tiered_forms.py --device cuda to check it on a given GPU.

Prefetch depth default (DEFAULT_PREFETCH_DEPTH): 2 layers on CUDA (PCIe copies need lead time and
cost the compute nothing), 0 on the CPU (the look-ahead runs on the compute thread and the loader
competes with compute for the same cores: it cost more than it saved, benchmarks/RESULTS.md,
"Tiered memory on the CPU").

Prefetch margin default (DEFAULT_PREFETCH_MARGIN = 2): a prediction of probability p displaces
only experts whose keep value is below p / margin. Decoding announces mostly router look-ahead
(probability 1, and right most of the time: benchmarks/tiered_prefetch.py) and co-occurrence
predictions of p >= 0.5: at 2, a sure announcement displaces experts used in under half of the
recent steps, and the README's wait ratios were measured with it. Co-occurrence alone, unfiltered,
is far less precise, so the trace replay of `strata bench cache` studies it at REPLAY_PREFETCH_MARGIN
= 8, where it both hits more and loads fewer experts than LRU; at 2 it hits more still but loads
more than LRU (figures: benchmarks/RESULTS.md, "Prefetch margins in the trace replay"). Both are
settings of the same policy and predictor objects (tests/memory/test_replay_decode.py pins that
replay and decoding decide alike at either); `--prefetch-margin` and `TieredConfig.prefetch_margin`
choose.

This module must not allocate, open model files for reading bytes, or touch a device.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from strata import native
# Policy margins of decoding and of the trace replay (see the module docstring); pager threads of the
# host tier; shares of available memory the CPU device and host tiers take by default, and the prefetch
# depth per device type (why: above default_slot_form). Defined where help texts read them without torch.
from strata.defaults import (DEFAULT_CPU_DEVICE_FRACTION, DEFAULT_HOST_FRACTION, DEFAULT_PAGER_THREADS,
                             DEFAULT_PREFETCH_DEPTH, DEFAULT_PREFETCH_MARGIN, REPLAY_PREFETCH_MARGIN)
from strata.errors import StrataError
from strata.gguf import ModelFile
from strata.units import GIB, KIB, MIB, TIB, format_bytes, itemsize, round_up

from .device import ExpertGeometry, check_form, largest_slabs
from .machine import Machine


class BudgetError(StrataError, ValueError):
    """A memory budget Strata cannot work with; the message says why and what would do."""


#: CUDA memory left free by the default device budget, for activations and the allocator's cache.
CUDA_HEADROOM_FRACTION = 0.05
CUDA_HEADROOM_MIN = GIB
#: The look-ahead's predictors (`TieredConfig.predictor`): the routers alone, or with the learned correction.
PREDICTORS = ("look-ahead", "corrected")
#: Co-occurrence predictions decoding loads: p >= this, once the predictor has seen this many tokens
#: (naive Bayes on a few counts is overconfident).
DEFAULT_COOCCURRENCE_MIN_PROB = 0.5
DEFAULT_COOCCURRENCE_MIN_TOKENS = 256
#: Prefetch only what pays: a prediction of probability p is loaded when p x saved > cost, with the
#: wait a used prefetch saves as the unit (one read hidden) and cost the share of a read a wasted one
#: takes from demand loads (the link's busy share while the loader runs). 0.5 is the bar decoding's
#: co-occurrence filter already used, so defaults decide as before for it; look-ahead, calibrated
#: by its own measured precision per depth (`predict.score`), loads only at depths where it is
#: right more often than not.
DEFAULT_PREFETCH_READ_COST = 0.5


@dataclass(frozen=True)
class TieredConfig:
    """Budgets and prefetch settings of `TieredExpertMemory`; None means the machine's default.

    device_mem, host_mem: bytes (int) or sizes such as '512M', '8G'.
    slot_form: 'dequantized' or 'packed' (None: the device's default).
    prefetch_depth: layers ahead to predict and load while a layer computes; 0 turns prefetch off
        (None: DEFAULT_PREFETCH_DEPTH of the device).
    cooccurrence: add the cross-layer co-occurrence predictor to the router look-ahead; its
        predictions below `cooccurrence_min_prob` are not loaded, nor any before it has seen
        `cooccurrence_min_tokens` tokens.
    prefetch_read_cost: prefetch only what pays: a prediction of probability p is loaded when
        p > prefetch_read_cost (a wasted read's cost in units of the wait a used prefetch saves; 0:
        load every prediction the policy admits). Look-ahead announcements carry their measured
        precision at their depth as p once it is known.
    predictor: the look-ahead's predictor (PREDICTORS): "look-ahead", the next routers on the
        current hidden state; "corrected", the same through a correction fitted online by least
        squares on the pairs decoding sees (`predict.correction`; its figures: docs/memory.md).
    prefetch_margin: the policies' margin (`PolicyConfig.prefetch_margin`): a prediction of
        probability p displaces only experts whose keep value is below p / margin.
    pager_threads, direct: the host tier's pager (threads; O_DIRECT: None = where possible).
    Experts are handed out as float weights (packed slots dequantized into scratch at each use);
    packed compute on the CPU is the paged memory's (`strata.memory.paged`).
    hybrid: compute missed experts that the host tier holds on the CPU (native kernels on the
        host slots) when the measured costs say it is faster than copying them (`strata.runtime.hybrid`).
        For CUDA; on the CPU device it runs too, for tests. Off by default:
        it pays only where the CPU is fast relative to PCIe and the misses carry few tokens
        (decode); once on, it measures its own rates, probing the CPU with one expert per format.
    """

    device_mem: int | str | None = None
    host_mem: int | str | None = None
    slot_form: str | None = None
    prefetch_depth: int | None = None
    cooccurrence: bool = True
    cooccurrence_min_prob: float = DEFAULT_COOCCURRENCE_MIN_PROB
    cooccurrence_min_tokens: int = DEFAULT_COOCCURRENCE_MIN_TOKENS
    prefetch_margin: float = DEFAULT_PREFETCH_MARGIN
    prefetch_read_cost: float = DEFAULT_PREFETCH_READ_COST
    predictor: str = "look-ahead"
    pager_threads: int = DEFAULT_PAGER_THREADS
    direct: bool | None = None
    hybrid: bool = False

    def __post_init__(self) -> None:
        if self.slot_form is not None:
            check_form(self.slot_form)
        d = self.prefetch_depth
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 0):
            raise StrataError(f"prefetch depth must be a whole number >= 0 (0: off), found {self.prefetch_depth!r}")
        if not self.prefetch_margin > 0:
            raise StrataError(f"prefetch margin must be positive, found {self.prefetch_margin!r}")
        if self.predictor not in PREDICTORS:
            raise StrataError(f"predictor must be one of {', '.join(PREDICTORS)}, found {self.predictor!r}")
        if not 0 <= self.prefetch_read_cost < 1:
            raise StrataError(f"prefetch read cost must be in [0, 1) (a share of one read), "
                              f"found {self.prefetch_read_cost!r}")

    def depth_for(self, device: torch.device, holds_all: bool = False) -> int:
        """The prefetch depth on `device`: the one asked for, else the device type's default, or 0
        when the device slots hold every expert (each stays once loaded, so announcements would
        cost a router pass per layer and step to speed up only each expert's first use)."""
        d = self.prefetch_depth
        if d is not None:
            return d
        return 0 if holds_all else DEFAULT_PREFETCH_DEPTH.get(device.type, 1)


_UNITS = {"": 1, "k": KIB, "m": MIB, "g": GIB, "t": TIB}
_SIZE = re.compile(r"^\s*([-+]?\d+(?:\.\d*)?|[-+]?\.\d+)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_bytes(value: Any, what: str) -> int | None:
    """A budget as bytes: an int, or a string such as '512M', '1.5GiB', '8g' (binary units).
    None stays None (the machine's default). BudgetError when it cannot be read or is not
    positive."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise BudgetError(f"{what} must be a number of bytes such as 512M or 8G, found {value!r}")
    if isinstance(value, (int, float)):
        n = int(value)
    else:
        m = _SIZE.match(str(value))
        if not m:
            raise BudgetError(f"{what} must be a number of bytes such as 512M or 8G, found {value!r}")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise BudgetError(f"{what} must be positive, found {value!r} ({n} bytes)")
    return n


# DEFAULT_PREFETCH_DEPTH (strata.defaults), when none is asked for, per device type. On the CPU
# the router look-ahead runs on the compute thread (a router pass per layer and step, and the loader's work under the GIL),
# which cost more than the overlap gained in every measurement here (README, "Tiered expert
# memory": 2-core machine, uniform and trace-calibrated routing): misses load on demand there
# unless a depth is asked for. On CUDA the look-ahead overlaps the GPU's work.

def default_slot_form(device: torch.device, fits_dequantized: bool) -> str:
    """The slot form used when none is asked for (see the module docstring)."""
    return "dequantized" if fits_dequantized else "packed"


@dataclass(frozen=True)
class Plan:
    """What the budgets come to for one model on one device."""

    form: str
    n_layers: int
    device_budget: int
    reserved: int  # resident weights and KV cache
    slot_bytes: int
    extra_bytes: int  # scratch (packed form) or CUDA staging
    slots_per_layer: int
    max_acquire: int
    host_budget: int

    @property
    def pool_bytes(self) -> int:
        return self.slots_per_layer * self.n_layers * self.slot_bytes


def _extra_bytes(form: str, geometry: ExpertGeometry, dtype: torch.dtype, device: torch.device,
                 n_scratch: int) -> int:
    if form == "packed":
        return n_scratch * geometry.slot_bytes("dequantized", dtype)
    return 2 * max(geometry.packed) if device.type == "cuda" else 0


def make_plan(model: ModelFile, geometry: ExpertGeometry, device: torch.device, dtype: torch.dtype, *,
              machine: Machine, device_mem: Any = None, host_mem: Any = None, slot_form: str | None = None,
              reserved: int = 0, host_align: int = 4096) -> Plan:
    """Slots per layer and budgets for `model` on `machine` (see the module docstring); BudgetError
    (one line naming the budget, what it must hold and what was found) when they cannot work."""
    hp, n_layers = model.hparams, len(model.expert_layers)
    top_k, n_experts = hp.n_experts_used, hp.n_experts
    device_budget = parse_bytes(device_mem, "device memory budget (--device-mem)")
    host_budget = parse_bytes(host_mem, "host memory budget (--host-mem)")
    total, free = machine.device
    where = f"{device.type} device" if device.type == "cpu" else str(device)
    if device_budget is not None and device_budget > total:
        raise BudgetError(f"device memory budget {device_budget} bytes ({format_bytes(device_budget)}) is larger than "
                          f"the {where}'s memory ({format_bytes(total)})")
    if device_budget is None:
        device_budget = (free - max(CUDA_HEADROOM_MIN, int(total * CUDA_HEADROOM_FRACTION)) if device.type == "cuda"
                         else int(free * DEFAULT_CPU_DEVICE_FRACTION))
    all_dequantized = n_layers * n_experts * geometry.slot_bytes("dequantized", dtype)
    form = check_form(slot_form) if slot_form else default_slot_form(
        device, reserved + all_dequantized + _extra_bytes("dequantized", geometry, dtype, device, 0) <= device_budget)
    slot_bytes = geometry.slot_bytes(form, dtype)
    extra = _extra_bytes(form, geometry, dtype, device, top_k)
    if reserved >= device_budget:
        raise BudgetError(f"{model.path}: resident weights and KV cache alone ({format_bytes(reserved)}) exceed "
                          f"the device memory budget ({format_bytes(device_budget)}); raise --device-mem, shorten "
                          f"the context (--ctx) or use a smaller compute dtype")
    per_layer = min(n_experts, (device_budget - reserved - extra) // slot_bytes // n_layers)
    if per_layer < top_k:
        need = reserved + extra + n_layers * top_k * slot_bytes
        raise BudgetError(f"device memory budget {device_budget} bytes ({format_bytes(device_budget)}) is too "
                          f"small for {model.path}: after resident weights and KV cache ({format_bytes(reserved)}), "
                          f"each of its {n_layers} expert layers needs {form} slots for its top-{top_k} experts at "
                          f"once, {slot_bytes} bytes per slot, so at least {need} bytes ({format_bytes(need)})")
    max_acquire = top_k if form == "packed" else per_layer  # packed: one scratch expert per acquired one
    if host_budget is None:
        host_budget = _default_host_budget(model, machine, host_align, per_layer == n_experts)
    return Plan(form, n_layers, device_budget, reserved, slot_bytes, extra, per_layer, min(max_acquire, per_layer),
                host_budget)


def _default_host_budget(model: ModelFile, machine: Machine, align: int, device_holds_all: bool) -> int:
    layout = slot_layout(model, align)
    if device_holds_all:  # only a staging path: every expert stays on the device once loaded
        return len(model.expert_layers) * model.hparams.n_experts_used * layout.slot_bytes
    return default_host_budget(model, layout, machine)


# ---- the host tier --------------------------------------------------------------------------------

@dataclass(frozen=True)
class SlotLayout:
    """Where each part of an expert lies inside a host slot (bytes; see `host.py`)."""

    align: int                       # A: the pager's O_DIRECT alignment (0: buffered reads)
    part_offset: tuple[int, int, int]    # gate, up, down region starts
    part_capacity: tuple[int, int, int]  # region lengths
    slot_bytes: int


def slot_layout(model: ModelFile, align: int) -> SlotLayout:
    """Host slot regions sized for the largest slab of each part over the expert layers, plus the
    slack a direct read of a 32-byte-aligned slab needs (`host.py`)."""
    unit = max(align, 64)  # regions start on cache lines even when reads are buffered
    capacity = tuple(round_up(n, unit) + align for n in largest_slabs(model))
    offsets = (0, capacity[0], capacity[0] + capacity[1])
    return SlotLayout(align, offsets, capacity, round_up(sum(capacity), unit))


def default_host_budget(model: ModelFile, layout: SlotLayout, machine: Machine) -> int:
    """DEFAULT_HOST_FRACTION of `machine`'s available RAM, at least top-k slots per layer, no more
    than a slot for every expert of the model."""
    return _slots_between(model, layout, int(machine.ram[1] * DEFAULT_HOST_FRACTION))


def paged_budget(model: ModelFile, machine: Machine, reserved: int = 0) -> int:
    """Default budget of the one-tier paged memory (`paged.py`): the RAM the tiered memory's two
    CPU tiers would take together (DEFAULT_CPU_DEVICE_FRACTION + DEFAULT_HOST_FRACTION of
    `machine`'s available RAM) less `reserved` (resident weights and KV cache), at least top-k
    slots per layer, no more than a slot for every expert."""
    with native.Pager(model, 1) as pager:
        layout = slot_layout(model, pager.info.align)
    return _slots_between(model, layout, paged_share(machine, reserved))


def paged_share(machine: Machine, reserved: int = 0) -> int:
    """The RAM the default paged budget starts from, before it is bounded by the model's slots:
    the tiered memory's two CPU tiers' shares of `machine`'s available RAM less `reserved`."""
    return int(machine.ram[1] * (DEFAULT_CPU_DEVICE_FRACTION + DEFAULT_HOST_FRACTION)) - reserved


def _slots_between(model: ModelFile, layout: SlotLayout, share: int) -> int:
    """`share` bytes, raised to top-k slots per layer and capped at a slot for every expert."""
    n_layers, hp = len(model.expert_layers), model.hparams
    minimum = n_layers * hp.n_experts_used * layout.slot_bytes
    every = n_layers * hp.n_experts * layout.slot_bytes
    return max(minimum, min(every, share))


def check_host_budget(budget: Any, model: ModelFile, layout: SlotLayout, top_k: int, machine: Machine) -> int:
    """The host budget as an int, or BudgetError (a ValueError) saying what is wrong with it."""
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise BudgetError(f"host memory budget must be a whole number of bytes, found {budget!r}")
    budget = int(budget)
    if budget <= 0:
        raise BudgetError(f"host memory budget must be positive, found {budget} bytes")
    total = machine.ram[0]
    if budget > total:
        raise BudgetError(f"host memory budget {budget} bytes ({format_bytes(budget)}) is larger than this "
                          f"machine's RAM ({format_bytes(total)})")
    n_layers = len(model.expert_layers)
    need = n_layers * top_k * layout.slot_bytes
    if budget < need:
        raise BudgetError(
            f"host memory budget {budget} bytes ({format_bytes(budget)}) is too small for {model.path}: each "
            f"of its {n_layers} expert layers needs slots for its top-{top_k} experts at once, "
            f"{layout.slot_bytes} bytes per slot (gate, up and down plus O_DIRECT slack), so at "
            f"least {need} bytes ({format_bytes(need)})")
    return budget


def resident_bytes(model: ModelFile, dtype: torch.dtype, compute: str = "float") -> int:
    """Bytes of the resident weights (all but routed experts) once dequantized into `dtype`, or,
    under packed compute, as the file stores them (matrices stay packed)."""
    if compute == "packed":
        return sum(info.nbytes for info in model.resident.values())
    size = itemsize(dtype)
    n = 0
    for info in model.resident.values():
        count = 1
        for d in info.shape:
            count *= int(d)
        n += count
    return n * size




def device_budget_for_slots(geometry: ExpertGeometry, form: str, dtype: torch.dtype, device: torch.device | str,
                            n_layers: int, slots_per_layer: int, top_k: int, reserved: int = 0) -> int:
    """The device budget that gives exactly `slots_per_layer` slots of `form` (tests, benchmarks)."""
    device = torch.device(device)
    extra = _extra_bytes(form, geometry, dtype, device, top_k)
    return reserved + extra + n_layers * slots_per_layer * geometry.slot_bytes(form, dtype)


def host_budget_for_slots(model: ModelFile, slots_per_layer: int, direct: bool | None = None) -> int:
    """The host budget that gives exactly `slots_per_layer` host slots (tests, benchmarks)."""
    with native.Pager(model, 1, direct=direct) as pager:
        align = pager.info.align
    return len(model.expert_layers) * slots_per_layer * slot_layout(model, align).slot_bytes


__all__ = ["CUDA_HEADROOM_FRACTION", "PREDICTORS", "DEFAULT_CPU_DEVICE_FRACTION", "DEFAULT_HOST_FRACTION", "DEFAULT_PREFETCH_DEPTH",
           "DEFAULT_PREFETCH_MARGIN", "REPLAY_PREFETCH_MARGIN", "BudgetError", "Plan", "SlotLayout", "TieredConfig",
           "check_host_budget", "default_host_budget", "default_slot_form", "device_budget_for_slots",
           "host_budget_for_slots", "make_plan", "paged_budget", "paged_share", "parse_bytes",
           "resident_bytes", "slot_layout"]
