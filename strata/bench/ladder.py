"""`strata bench ladder MODEL`: the ablation ladder. One model, one set of budgets, one run per
row, each row adding one mechanism to the one above, so each mechanism's share of the speed is
measured rather than claimed:

  naive                    every expert a step needs is read and dequantized from the mapped file
                           on each use (`memory="direct"`, float compute), one sequence
  + batching               the same, `batch` sequences decoded together (an expert read once serves
                           every token of the step that routed to it)
  + prefetch               the tiered memory with the smallest pools that work (top-k device and
                           host slots per layer: no room to keep experts between steps), the router
                           look-ahead loading the next layers' experts while a layer computes
                           (depth 1 on the CPU unless given, though the CPU's default is 0: this
                           row measures the mechanism, and the rows below keep it)
  + placement and caching  the tiered memory with the budgets given (or the machine's defaults):
                           hot experts stay resident, placed at start from the file's routing
                           statistics and kept by the policy
  + packed compute         (CPU) the native kernels compute from the packed slots in place (the
                           paged memory: the budgets given are its one RAM tier, no prefetch);
                           (CUDA) misses the host tier holds are computed on the CPU (hybrid)

Each row: decode tokens/s over `gen` tokens per sequence (the same one-token prompts in every row),
its ratio to the naive row, and the expert memory that ran it (the runtime plan's name). A row
can be slower than naive: `MEASURES` says what each row isolates, which the table shows then.
Must not print: `strata.commands.bench` formats the result.
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable

from strata.errors import SlowPathWarning

from strata.memory.budget import DEFAULT_PREFETCH_DEPTH

from .model import _decode

ROWS = ("naive", "+ batching", "+ prefetch", "+ placement and caching", "+ packed compute")
#: What each row isolates: why it may be slower than naive (shown by the table only then).
MEASURES = {
    "+ batching": "a step of several sequences is timed per token; a model too small to share experts "
                  "between sequences gains little from reading each expert once",
    "+ prefetch": "top-k slots per layer leave no room to keep experts between steps: every step copies its "
                  "experts into slots (and waits for the look-ahead), which the mapped file's page cache "
                  "serves for free in the naive row; it measures prefetch overlap, not caching",
    "+ placement and caching": "experts kept in slots are dequantized once, but the tiered memory's bookkeeping "
                               "per step costs more than reading a small model's experts from the page cache",
    "+ packed compute": "the native kernels pay a per-call cost that tiny matrices do not amortise",
}


def _smallest_tiered(path: str, prefetch_depth: int | None):
    """A `strata.load` memory factory: the tiered memory with top-k device and host slots per layer."""
    from strata.gguf import open_model
    from strata.memory.budget import device_budget_for_slots, host_budget_for_slots, make_plan
    from strata.memory.device import expert_geometry
    from strata.memory.machine import Machine
    from strata.memory.tiered import TieredConfig, TieredExpertMemory

    def build(mf, device, dtype, n_threads):
        k, machine = mf.hparams.n_experts_used, Machine.measure(device)
        geometry, n_layers = expert_geometry(mf), len(mf.expert_layers)
        form = make_plan(mf, geometry, device, dtype, machine=machine, device_mem=device_budget_for_slots(
            geometry, "packed", dtype, device, n_layers, k, k)).form  # the form such a pool takes
        config = TieredConfig(device_mem=device_budget_for_slots(geometry, form, dtype, device, n_layers, k, k),
                              host_mem=host_budget_for_slots(mf, k), slot_form=form, prefetch_depth=prefetch_depth)
        with warnings.catch_warnings():  # slots this small are the row's point: no "raise --host-mem"
            warnings.simplefilter("ignore", SlowPathWarning)
            return TieredExpertMemory(mf, device=device, dtype=dtype, n_threads=n_threads, config=config,
                                      machine=machine)

    with open_model(path):  # fail early, with the file's own error, before the first row
        pass
    return build


def bench_ladder(path: str, *, gen: int = 32, batch: int = 8, device: str = "cpu", dtype: str | None = None,
                 threads: int | None = None, n_ctx: int | None = None, device_mem: Any = None, host_mem: Any = None,
                 prefetch_depth: int | None = None, seed: int = 0,
                 on_row: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    """See the module docstring; returns {"rows": [{"name", "tok_s", "ratio", "batch", "config",
    "memory", "memory_detail"}], ...}. `on_row(done, total, name)` after each row (progress)."""
    import strata
    import torch

    if gen < 2 or batch < 1:
        raise ValueError(f"ladder: gen >= 2 and batch >= 1, found gen {gen}, batch {batch}")
    cuda = torch.device(device).type == "cuda"
    if prefetch_depth is None:  # the ladder measures prefetch: on, at the device's depth or 1 (the
        prefetch_depth = max(1, DEFAULT_PREFETCH_DEPTH.get(torch.device(device).type, 1))  # CPU's default is 0)
    common = dict(device=device, dtype=dtype, threads=threads, n_ctx=n_ctx or gen + 16)
    budgets = dict(device_mem=device_mem, host_mem=host_mem, prefetch_depth=prefetch_depth)
    configs = [
        (1, dict(memory="direct", compute="float")),
        (batch, dict(memory="direct", compute="float")),
        (batch, dict(memory=_smallest_tiered(path, prefetch_depth), compute="float")),
        (batch, dict(memory="tiered", compute="float", **budgets)),
        (batch, dict(memory="tiered", compute="float", hybrid=True, **budgets) if cuda
         else dict(memory="tiered", compute="packed", device_mem=device_mem, host_mem=host_mem)),
    ]
    rows = []
    for name, (b, cfg) in zip(ROWS, configs):
        t0 = time.perf_counter()
        with strata.load(path, max_batch=b, **common, **cfg) as model:
            model.generate([1, 2], max_tokens=2, temperature=0, stop_token_ids=())  # warm-up: first calls, thread pools
            run = _decode(model, b, gen, seed)
            detail = repr(model.memory)
            detail = type(model.memory).__name__ if detail.startswith("<") else detail
            memory = model.plan.memory
        shown = {k: (v if isinstance(v, (str, int, float, bool)) or v is None else "top-k slots per layer")
                 for k, v in cfg.items()}
        rows.append({"name": name, "batch": b, "tok_s": run["tok_s"], "tokens": run["tokens"], "config": shown,
                     "memory": memory, "memory_detail": detail, "seconds": time.perf_counter() - t0})
        if on_row is not None:
            on_row(len(rows), len(configs), name)
    naive = rows[0]["tok_s"]
    for r in rows:
        r["ratio"] = r["tok_s"] / naive if naive > 0 else None
    return {"file": str(path), "gen": gen, "batch": batch, "device": device, "threads": threads, "rows": rows}


__all__ = ["MEASURES", "ROWS", "bench_ladder"]
