"""A tiny MoE model file for the tiered-memory tests, and memories of it under chosen pressure.

The model is `strata.synth`'s random Qwen3-MoE checkpoint with 3 layers of 8 experts (top-2),
converted with the default types (attention Q8_0, experts Q4_K), built once per process.
`tiered(...)` gives a `strata.load` factory for a TieredExpertMemory with exactly the slots
asked for: the acceptance tests use 2 device slots and 4 host slots per layer, so the experts
are 4x the device slot pool and 2x the host budget.
"""
from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path

import torch

from converters import TypePolicy, convert
from strata.synth import build_checkpoint
from strata.gguf import open_model
from strata.memory.budget import device_budget_for_slots, host_budget_for_slots
from strata.memory.device import expert_geometry
from strata.memory.tiered import TieredConfig, TieredExpertMemory

N_LAYERS, N_EXPERTS, TOP_K = 3, 8, 2
DEVICE_SLOTS, HOST_SLOTS = N_EXPERTS // 4, N_EXPERTS // 2  # experts are 4x the device pool, 2x the host's
#: Generation options of runs compared token for token and counter for counter: greedy, no stop token.
GREEDY = dict(temperature=0, stop_token_ids=())
FORMS = ("dequantized", "packed")  # the slot forms every tiered test runs in


@cache
def moe_file(experts: str = "q4_k") -> Path:
    root = Path(tempfile.mkdtemp(prefix="strata-tiered-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    hf = build_checkpoint(root / "hf", seed=3, num_hidden_layers=N_LAYERS, num_experts=N_EXPERTS,
                          num_experts_per_tok=TOP_K)
    out = root / f"moe-{experts}.gguf"
    convert(hf, out, TypePolicy.from_args(experts=experts), name="tiered-test", n_threads=2)
    return out


def budgets(path: Path, form: str, dtype: torch.dtype = torch.float32, device: str = "cpu",
            device_slots: int = DEVICE_SLOTS, host_slots: int = HOST_SLOTS) -> tuple[int, int]:
    """(device_mem, host_mem) giving exactly these slots per layer, with nothing reserved."""
    with open_model(path) as mf:
        geometry = expert_geometry(mf)
        device_mem = device_budget_for_slots(geometry, form, dtype, device, len(mf.expert_layers), device_slots, TOP_K)
        return device_mem, host_budget_for_slots(mf, host_slots)


def tiered(path: Path, form: str, prefetch_depth: int = 1, dtype: torch.dtype = torch.float32,
           device: str = "cpu", **config):
    """A `strata.load(memory=...)` factory: tiered memory at the acceptance pressure (it hands out
    float weights: load with compute='float')."""
    device_mem, host_mem = budgets(path, form, dtype, device)
    cfg = TieredConfig(device_mem=device_mem, host_mem=host_mem, slot_form=form, prefetch_depth=prefetch_depth,
                       **config)

    def build(mf, dev, dt, n_threads):
        return TieredExpertMemory(mf, device=dev, dtype=dt, n_threads=n_threads, config=cfg)

    return build


def load_tiered(path: Path, form: str = "dequantized", depth: int = 1, **config):
    """`strata.load` of `path` with `tiered(path, form, depth, **config)`: one thread, 256
    positions, float compute (packed compute on the CPU is the paged memory's)."""
    import strata

    return strata.load(path, threads=1, n_ctx=256, compute="float", memory=tiered(path, form, depth, **config))


def prompt(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 400, (n,), generator=g).tolist()
