"""What `strata.load` builds around the model: the expert memory its config describes and the KV
cache, each sized against the machine's memory measured once at load (`Machine`) and handed down.

    machine = Machine.measure(device)                     # the one measurement of a load
    config, why = memory_config_for("tiered", {"host_mem": "8G"}, "packed")  # -> served by "paged"
    config, why = settle_default(None, {}, config, why, mf, device, dtype, "packed", kv, machine)  # the default, from the file
    memory = expert_memory(config, mf, device, dtype, n_threads, "packed", kv, machine)

Must not: read /proc, cgroups or the GPU's free memory itself (`strata.memory.machine` does, in
`Machine.measure`), or decide a runner (`strata.runtime.plan`).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

from strata.defaults import CACHE_RAM_SHARE, DEFAULT_CACHE_RAM
from strata.errors import ContextWarning, StrataArgumentError, StrataError
from strata.gguf import ModelFile
from strata.memory import DirectExpertMemory, ExpertMemory
from strata.memory.budget import (BudgetError, host_budget_for_slots, paged_budget, paged_share, parse_bytes,
                                  resident_bytes)
from strata.memory.machine import Machine
from strata.memory.paged import PagedExpertMemory
from strata.memory.residency import resident_share
from strata.memory.tiered import TieredExpertMemory
from strata.models import cache_dims, cache_states
from strata.runtime.plan import FileFit, default_memory_row
from strata.units import format_bytes

from .config import MEMORY_OPTIONS, MemoryConfig, check_memory_compute, memory_config
from .kv_cache import BLOCK_SIZE, KVCache, blocks_for

#: Builds the expert memory of a model: (model_file, device, dtype, n_threads) -> ExpertMemory.
MemoryFactory = Callable[[ModelFile, torch.device, torch.dtype, int], ExpertMemory]


def memory_config_for(memory: MemoryConfig | MemoryFactory | str | None, options: dict[str, Any],
                      mode: str) -> tuple[MemoryConfig | MemoryFactory, str]:
    """The MemoryConfig of load()'s `memory` and keyword options, its kind chosen for the compute
    mode `mode` and checked against it, and how the kind was chosen (for the runtime plan; "": as
    asked); a factory as given."""
    unknown = sorted(set(options) - set(MEMORY_OPTIONS["tiered"]))
    if unknown:
        raise TypeError(f"load() got an unexpected keyword argument {unknown[0]!r}")
    if callable(memory):
        if any(v is not None for v in options.values()):
            raise StrataArgumentError(f"{', '.join(options)}: options of a MemoryConfig, not of a memory factory")
        return memory, "a factory given to load"
    asked = memory_config(memory, options)
    config = asked.resolved(mode)
    check_memory_compute(config, mode)
    return config, _memory_why(asked, config, mode)


def _memory_why(asked: MemoryConfig, config: MemoryConfig, mode: str) -> str:
    if config.backend(mode) != config.kind:
        return (f"memory='{config.kind}' with {mode} compute on the CPU: its device and host tiers would both "
                f"be RAM, so the {config.backend(mode)} memory's one RAM tier serves it (host_mem plus "
                f"device_mem less the resident weights and KV cache)")
    return "as asked" if asked.kind is not None else f"the default for {mode} compute"


def settle_default(memory: MemoryConfig | MemoryFactory | str | None, options: dict[str, Any],
                   config: MemoryConfig | MemoryFactory, why: str, mf: ModelFile, dev: torch.device,
                   dt: torch.dtype, mode: str, kv_bytes: int, machine: Machine,
                   resident: Callable[[ModelFile], float | None] | None = None
                   ) -> tuple[MemoryConfig | MemoryFactory, str]:
    """load()'s memory once the file is open: `config` and `why` (`memory_config_for`) as they
    are, except the default of packed compute on the CPU (no kind asked, no miss stand-ins: those
    are the paged memory's), which the runtime plan settles from the file (`default_memory_row`):
    direct when every expert fits the paged memory's RAM budget and the experts sit in the page
    cache (`resident`), else paged."""
    if callable(config) or dev.type != "cpu" or mode != "packed" or config.miss_stand_in is not None \
            or memory_config(memory, options).kind is not None:
        return config, why
    reserved = reserved_bytes(mf, dt, mode, kv_bytes)
    budget = config.ram_budget(reserved) or paged_share(machine, reserved)  # the user's, or the machine's share
    experts = host_budget_for_slots(mf, mf.hparams.n_experts)  # a slot for every expert: nothing evicted
    fits = experts <= budget
    kind, why = default_memory_row(FileFit(experts, budget, (resident or resident_share)(mf) if fits else None))
    return (MemoryConfig.build(kind) if kind != config.kind else config), why


def reserved_bytes(mf: ModelFile, dt: torch.dtype, mode: str, kv_bytes: int) -> int:
    """What the rest of the model takes of the expert memory's budget: resident weights and KV cache."""
    return resident_bytes(mf, dt, mode) + kv_bytes


def ram_budget(config: MemoryConfig, mf: ModelFile, machine: Machine, reserved: int) -> int:
    """The paged memory's one RAM budget for `config` (memory='paged', or 'tiered' served by it):
    the one asked for, else `budget.paged_budget` of `machine`."""
    return config.ram_budget(reserved) or paged_budget(mf, machine, reserved)


def expert_memory(config: MemoryConfig | MemoryFactory, mf: ModelFile, dev: torch.device, dt: torch.dtype,
                  n_threads: int, mode: str, kv_bytes: int, machine: Machine) -> ExpertMemory:
    """The expert memory `config` describes (the tiered and paged budgets leave room for the
    resident weights and the KV cache, and start from `machine`)."""
    if callable(config):
        return config(mf, dev, dt, n_threads)
    if config.kind == "direct":
        return DirectExpertMemory(mf, device=dev, dtype=dt, n_threads=n_threads, packed=mode == "packed")
    reserved = reserved_bytes(mf, dt, mode, kv_bytes)
    if config.backend(mode) == "paged":  # the tiered memory's options too, on the CPU with packed compute
        return PagedExpertMemory(mf, host_mem=ram_budget(config, mf, machine, reserved), machine=machine,
                                 miss_stand_in=config.miss_stand_in, stand_in_mode=config.stand_in_mode)
    return TieredExpertMemory(mf, device=dev, dtype=dt, n_threads=n_threads, config=config.to_tiered(),
                              reserved_bytes=reserved, machine=machine)


def kv_bytes(mf: ModelFile, dev: torch.device, dt: torch.dtype, ctx: int, max_batch: int,
             kv_blocks: int | None, machine: Machine, kv_type: str | None = None) -> int:
    """Bytes of the KV cache, refused before anything is allocated when it cannot hold one
    sequence or does not fit the device's free memory."""
    hp = mf.hparams
    if kv_blocks is not None and kv_blocks < blocks_for(ctx):
        raise StrataError(f"kv_blocks={kv_blocks}: blocks of {BLOCK_SIZE} positions cannot hold one sequence of "
                          f"n_ctx={ctx} ({blocks_for(ctx)} blocks)")
    try:
        n = KVCache.bytes_for(hp.n_layers, max_batch, ctx, *cache_dims(hp), dt, n_blocks=kv_blocks, kv_type=kv_type,
                              states=cache_states(hp))
    except StrataError as e:  # a cache type the model's rows do not fit
        raise StrataError(f"{mf.path}: {e}") from None
    free = machine.device[1]
    if n > free:
        pool = (f"{kv_blocks} blocks of {BLOCK_SIZE} positions" if kv_blocks is not None
                else f"n_ctx={ctx} x {max_batch} sequences")
        raise StrataError(f"{mf.path}: {pool}: the KV cache needs {format_bytes(n)}, {dev} has "
                          f"{format_bytes(free)} free; use a smaller context, batch or --kv-blocks")
    if ctx > hp.context_length:
        warnings.warn(f"{mf.path}: n_ctx={ctx} is above the {hp.context_length} positions the model was trained "
                      f"for (text past them may degrade); its KV cache takes {format_bytes(n)} of "
                      f"{'RAM' if dev.type == 'cpu' else str(dev) + ' memory'}", ContextWarning, stacklevel=2)
    return n


def prefix_cache_blocks(mf: ModelFile, dev: torch.device, dt: torch.dtype, cache_ram: int | str | None,
                        kv_type: str | None, machine: Machine, prefix_cache: bool) -> int:
    """KV blocks added to the pool beyond the sequences' for the prefix cache to keep prompts in
    (blocks no sequence holds stay cached until allocation needs them): `cache_ram` bytes' worth
    (an int or a size such as "2G"; 0 or None: none; "auto": DEFAULT_CACHE_RAM, at most
    CACHE_RAM_SHARE of the RAM available, and none on CUDA, whose memory the experts need). 0
    without a prefix cache, or for a model with recurrent layers (their state cannot be cached)."""
    if cache_ram in (None, 0, "0") or not prefix_cache or cache_states(mf.hparams):
        return 0
    if cache_ram == "auto":
        if dev.type != "cpu":
            return 0
        n = min(DEFAULT_CACHE_RAM, int(machine.ram[1] * CACHE_RAM_SHARE))
    else:
        try:
            n = parse_bytes(cache_ram, "cache_ram (--cache-ram)")
        except BudgetError as e:
            raise StrataArgumentError(f"{e}, or 0 or auto") from None
    per_block = KVCache.bytes_for(mf.hparams.n_layers, 1, BLOCK_SIZE, *cache_dims(mf.hparams), dt, n_blocks=1,
                                  kv_type=kv_type)
    return n // per_block


def kv_cache(mf: ModelFile, dev: torch.device, dt: torch.dtype, ctx: int, max_batch: int, kv_blocks: int | None,
             n_bytes: int, prefix_cache: bool = True, kv_type: str | None = None) -> KVCache:
    hp = mf.hparams
    try:
        return KVCache(hp.n_layers, max_batch, ctx, *cache_dims(hp), dtype=dt, device=dev, n_blocks=kv_blocks,
                       prefix_cache=prefix_cache, kv_type=kv_type, states=cache_states(hp))
    except (RuntimeError, MemoryError) as e:
        raise StrataError(f"{mf.path}: cannot allocate the KV cache of n_ctx={ctx} x {max_batch} sequences "
                          f"({format_bytes(n_bytes)}) on {dev}: {str(e).splitlines()[0] if str(e) else 'out of memory'}"
                          ) from None


__all__ = ["MemoryFactory", "expert_memory", "kv_bytes", "kv_cache", "memory_config_for", "prefix_cache_blocks",
           "ram_budget", "reserved_bytes", "settle_default"]
