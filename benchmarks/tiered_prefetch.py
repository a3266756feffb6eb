"""Benchmark: time compute waits for experts with prefetch on vs off, with recall and precision.

    python benchmarks/tiered_prefetch.py [--file PATH] [--gib 0.25] [--tokens 64] [--repeat 2] [--json]
        [--device cpu] [--forms packed dequantized] [--depths 0 1 2]

On a synthetic Qwen3-MoE file (benchmarks/synthetic_moe.py: 32 experts per layer, top-4, random
routing; weight scale 0.6, so each layer changes the residual stream by ~17%, as real models do
little more than that) with device and host budgets far below the experts' size, so decoding
misses in both tiers: `strata bench tiered` decodes the same tokens with each prefetch depth,
alternating runs, and reports the decode steps' waits (prefill excluded). The acceptance figure
is the ratio of the median wait with prefetch to the median wait without (target: <= 0.40).
Budgets: the device holds a quarter of each layer's experts, the host tier a third.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.synthetic_moe import write  # noqa: E402
from strata.gguf import open_model  # noqa: E402
from strata.memory.budget import device_budget_for_slots, host_budget_for_slots, resident_bytes  # noqa: E402
from strata.memory.device import expert_geometry  # noqa: E402
from strata.engine.kv_cache import KVCache  # noqa: E402
from strata.bench.tiered import bench_tiered  # noqa: E402
from strata.commands.bench import format_tiered  # noqa: E402

N_CTX = 256


def budgets(path: Path, form: str, device: str, dtype: torch.dtype, device_share: float,
            host_share: float) -> tuple[int, int]:
    """(device_mem, host_mem) holding these shares of each layer's experts, resident weights and
    KV cache included in device_mem."""
    with open_model(path) as mf:
        hp, n_layers = mf.hparams, len(mf.expert_layers)
        reserved = resident_bytes(mf, dtype) + KVCache.bytes_for(hp.n_layers, 4, N_CTX, hp.n_head_kv, hp.head_dim,
                                                                 hp.head_dim_v, dtype)
        slots = max(hp.n_experts_used + 1, round(hp.n_experts * device_share))
        device_mem = device_budget_for_slots(expert_geometry(mf), form, dtype, device, n_layers, slots,
                                             hp.n_experts_used, reserved)
        host = max(hp.n_experts_used + 1, round(hp.n_experts * host_share))
        return device_mem, host_budget_for_slots(mf, host)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", type=Path, default=Path(tempfile.gettempdir()) / "strata-tiered-prefetch.gguf")
    p.add_argument("--gib", type=float, default=0.25)
    p.add_argument("--device", default="cpu")
    p.add_argument("--forms", nargs="+", default=["packed", "dequantized"])
    p.add_argument("--depths", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--device-share", type=float, default=0.25)
    p.add_argument("--host-share", type=float, default=1 / 3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if not a.file.exists():
        write(a.file, int(a.gib * 2**30), n_experts=32, top_k=4, weight_scale=0.6)
    dtype = torch.float32 if a.device == "cpu" else torch.bfloat16
    results = {}
    for form in a.forms:
        device_mem, host_mem = budgets(a.file, form, a.device, dtype, a.device_share, a.host_share)
        results[form] = bench_tiered(str(a.file), depths=a.depths, tokens=a.tokens, repeat=a.repeat,
                                     device=a.device, dtype=dtype, n_ctx=N_CTX, device_mem=device_mem,
                                     host_mem=host_mem, slot_form=form)
        results[form].update(device_mem=device_mem, host_mem=host_mem)
        if not a.json:
            print(format_tiered(results[form]), flush=True)
            print(f"  (device_mem {device_mem}, host_mem {host_mem})\n", flush=True)
    if a.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
