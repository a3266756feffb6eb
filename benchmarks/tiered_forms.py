"""Benchmark: the two device slot forms at equal device budgets, to choose each device's default.

    python benchmarks/tiered_forms.py [--device cpu|cuda] [--file PATH] [--shares 1 0.5 0.25]
        [--depths 0 2] [--tokens 48] [--repeat 2] [--json]

On a synthetic Qwen3-MoE file (benchmarks/synthetic_moe.py: 4 layers of 32 experts, top-4,
~0.1 GiB of Q4_K experts, ~0.8 GiB once dequantized to float32), for each device budget given
as a share of "every expert dequantized" (plus resident weights and KV cache), decode the same
tokens with the `dequantized` and the `packed` form, alternating runs, prefetch depths as given,
and report decode tokens/s, device hit rate and the time compute waited for experts. The packed
form fits 7x (float32; 3.5x in bfloat16) more experts into the same bytes but dequantizes on
every use. The host tier holds a third of the experts in every run.
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
from benchmarks.tiered_prefetch import N_CTX  # noqa: E402
from strata.engine.kv_cache import KVCache  # noqa: E402
from strata.gguf import open_model  # noqa: E402
from strata.memory.budget import host_budget_for_slots, resident_bytes  # noqa: E402
from strata.memory.device import expert_geometry  # noqa: E402
from strata.bench.tiered import bench_tiered  # noqa: E402


def device_budget(path: Path, share: float, dtype: torch.dtype, device: str) -> tuple[int, int]:
    """(device_mem, host_mem): resident + KV + `share` of every expert dequantized (+ scratch)."""
    with open_model(path) as mf:
        hp, n_layers = mf.hparams, len(mf.expert_layers)
        g = expert_geometry(mf)
        reserved = resident_bytes(mf, dtype) + KVCache.bytes_for(hp.n_layers, 4, N_CTX, hp.n_head_kv, hp.head_dim,
                                                                 hp.head_dim_v, dtype)
        every = n_layers * hp.n_experts * g.slot_bytes("dequantized", dtype)
        staging = 2 * max(g.packed) if device != "cpu" else 0
        scratch = hp.n_experts_used * g.slot_bytes("dequantized", dtype)  # the packed form's
        return (reserved + max(staging, scratch) + int(share * every),
                host_budget_for_slots(mf, max(hp.n_experts_used, hp.n_experts // 3)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", type=Path, default=Path(tempfile.gettempdir()) / "strata-tiered-forms.gguf")
    p.add_argument("--device", default="cpu")
    p.add_argument("--shares", type=float, nargs="+", default=[1.0, 0.5, 0.25])
    p.add_argument("--depths", type=int, nargs="+", default=[0, 2])
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if not a.file.exists():
        write(a.file, int(0.1 * 2**30), n_experts=32, top_k=4, weight_scale=0.6)
    dtype = torch.float32 if a.device == "cpu" else torch.bfloat16
    rows = []
    for share in a.shares:
        device_mem, host_mem = device_budget(a.file, share, dtype, a.device)
        for form in ("dequantized", "packed"):
            r = bench_tiered(str(a.file), depths=a.depths, tokens=a.tokens, repeat=a.repeat, device=a.device,
                             dtype=dtype, n_ctx=N_CTX, device_mem=device_mem, host_mem=host_mem, slot_form=form)
            for depth, x in r["by_depth"].items():
                rows.append({"share": share, "device_mem": device_mem, "form": form, "depth": depth,
                             "slots_per_layer": x["device_slots_per_layer"], "tok_s": x["decode_tok_s"],
                             "device_hit_rate": x["device_hit_rate"], "wait_s": x["wait_s"],
                             "dequant_s": x["dequant_s"], "same_tokens": r["same_tokens"]})
                if not a.json:
                    row = rows[-1]
                    print(f"share {share:>4} ({device_mem / 2**20:7.1f} MiB)  {form:<11} depth {depth}: "
                          f"{row['slots_per_layer']:>2} slots/layer  {row['tok_s']:6.2f} tok/s  hit "
                          f"{100 * row['device_hit_rate']:5.1f}%  wait {row['wait_s']:.3f} s  dequant "
                          f"{row['dequant_s']:.3f} s", flush=True)
    if a.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
