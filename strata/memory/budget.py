"""Memory budgets of the tiered expert memory: parsing, machine defaults, checks, and the plan
that turns them into slot counts. Plain arithmetic; nothing is allocated here.

Device budget (`device_mem`): every byte the model may use on the compute device (VRAM on CUDA,
RAM on the CPU device): resident weights and KV cache (`reserved`), the expert slot pool, and
the packed form's scratch (or CUDA staging). Default: on CUDA the free memory less a headroom
for activations; on the CPU DEFAULT_CPU_DEVICE_FRACTION of MemAvailable. Either way no more
than every expert needs.

Host budget (`host_mem`): the host tier's pool of packed experts. Default: the host tier's
minimum (top-k slots per layer) when the device holds every expert, else DEFAULT_HOST_FRACTION
of MemAvailable, no more than every expert needs.

Slot form default: `dequantized` when every expert fits the device budget dequantized, else
`packed`, on both devices. Figures (benchmarks/tiered_forms.py, CPU, float32, 4 layers x 32
experts, decode tok/s dequantized vs packed): budget for every expert 61-70 vs 39-41; for half
of them 42-43 vs 39-40; for a quarter 36-41 vs 41-43. A dequantized hit is a bare GEMM, but
the packed form holds 7x (float32; 3.5x in bfloat16) more experts in the same bytes, and once
the pool holds a small share of the experts the misses it saves outweigh the dequantization at
every use. On CUDA the same rule holds a fortiori (the GPU dequantizes a slot far faster than
PCIe refills one); run benchmarks/tiered_forms.py --device cuda to check it on a given GPU.

Prefetch depth default: 2 layers on CUDA (PCIe copies need lead time and cost the compute
nothing), 1 on the CPU (the loader competes with compute for the same cores).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from strata.gguf import ModelFile

from .device import ExpertGeometry, check_form
from .host import BudgetError, machine_memory, slot_layout

#: Share of MemAvailable the CPU device tier takes by default.
DEFAULT_CPU_DEVICE_FRACTION = 0.25
#: Share of MemAvailable the host tier takes by default when the device cannot hold every expert.
DEFAULT_HOST_FRACTION = 0.25
#: CUDA memory left free by the default device budget, for activations and the allocator's cache.
CUDA_HEADROOM_FRACTION = 0.05
CUDA_HEADROOM_MIN = 1 << 30

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
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


def gib(n: int) -> str:
    """A byte count for people: MiB below 1 GiB, else GiB."""
    return f"{n / 2**20:.1f} MiB" if abs(n) < 2**30 else f"{n / 2**30:.2f} GiB"


def device_memory(device: torch.device) -> tuple[int, int]:
    """(total, free) bytes of the compute device: the GPU's, or this machine's RAM."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(total), int(free)
    return machine_memory()


#: Prefetch depth when none is asked for, per device type.
DEFAULT_PREFETCH_DEPTH = {"cpu": 1, "cuda": 2}


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
              device_mem: Any = None, host_mem: Any = None, slot_form: str | None = None,
              reserved: int = 0, host_align: int = 4096) -> Plan:
    """Slots per layer and budgets for `model` (see the module docstring); BudgetError (one line
    naming the budget, what it must hold and what was found) when they cannot work."""
    hp, n_layers = model.hparams, len(model.expert_layers)
    top_k, n_experts = hp.n_experts_used, hp.n_experts
    device_budget = parse_bytes(device_mem, "device memory budget (--device-mem)")
    host_budget = parse_bytes(host_mem, "host memory budget (--host-mem)")
    total, free = device_memory(device)
    where = f"{device.type} device" if device.type == "cpu" else str(device)
    if device_budget is not None and device_budget > total:
        raise BudgetError(f"device memory budget {device_budget} bytes ({gib(device_budget)}) is larger than "
                          f"the {where}'s memory ({gib(total)})")
    if device_budget is None:
        device_budget = (free - max(CUDA_HEADROOM_MIN, int(total * CUDA_HEADROOM_FRACTION)) if device.type == "cuda"
                         else int(free * DEFAULT_CPU_DEVICE_FRACTION))
    all_dequantized = n_layers * n_experts * geometry.slot_bytes("dequantized", dtype)
    form = check_form(slot_form) if slot_form else default_slot_form(
        device, reserved + all_dequantized + _extra_bytes("dequantized", geometry, dtype, device, 0) <= device_budget)
    slot_bytes = geometry.slot_bytes(form, dtype)
    extra = _extra_bytes(form, geometry, dtype, device, top_k)
    if reserved >= device_budget:
        raise BudgetError(f"{model.path}: resident weights and KV cache alone ({gib(reserved)}) exceed the "
                          f"device memory budget ({gib(device_budget)}); raise --device-mem, shorten the context "
                          f"(--ctx) or use a smaller compute dtype")
    per_layer = min(n_experts, (device_budget - reserved - extra) // slot_bytes // n_layers)
    if per_layer < top_k:
        need = reserved + extra + n_layers * top_k * slot_bytes
        raise BudgetError(f"device memory budget {device_budget} bytes ({gib(device_budget)}) is too small for "
                          f"{model.path}: after resident weights and KV cache ({gib(reserved)}), each of its "
                          f"{n_layers} expert layers needs {form} slots for its top-{top_k} experts at once, "
                          f"{slot_bytes} bytes per slot, so at least {need} bytes ({gib(need)})")
    max_acquire = top_k if form == "packed" else per_layer
    if host_budget is None:
        host_budget = _default_host_budget(model, host_align, per_layer == n_experts)
    return Plan(form, n_layers, device_budget, reserved, slot_bytes, extra, per_layer, min(max_acquire, per_layer),
                host_budget)


def _default_host_budget(model: ModelFile, align: int, device_holds_all: bool) -> int:
    hp, n_layers = model.hparams, len(model.expert_layers)
    slot = slot_layout(model, align).slot_bytes
    minimum = n_layers * hp.n_experts_used * slot
    if device_holds_all:
        return minimum  # only a staging path: every expert stays on the device once loaded
    every = n_layers * hp.n_experts * slot
    return max(minimum, min(every, int(machine_memory()[1] * DEFAULT_HOST_FRACTION)))


def resident_bytes(model: ModelFile, dtype: torch.dtype) -> int:
    """Bytes of the resident weights (all but routed experts) once dequantized into `dtype`."""
    size = torch.empty((), dtype=dtype).element_size()
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
    from strata.native import Pager

    with Pager(model.path, 1, direct=direct) as pager:
        align = pager.info.align
    return len(model.expert_layers) * slots_per_layer * slot_layout(model, align).slot_bytes


__all__ = ["CUDA_HEADROOM_FRACTION", "DEFAULT_CPU_DEVICE_FRACTION", "DEFAULT_HOST_FRACTION", "DEFAULT_PREFETCH_DEPTH",
           "Plan", "default_slot_form", "device_budget_for_slots", "device_memory", "gib", "host_budget_for_slots",
           "make_plan", "parse_bytes", "resident_bytes"]
