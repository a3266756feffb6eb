"""Benchmark: the native decode attention, one sequence, serial and on a 2-thread pool.

    python benchmarks/attn_rate.py [--positions 560 4000] [--kv-type f32] [--heads 4] [--kv-heads 1]
        [--head-dim 128] [--layers 96] [--reps 20] [--threads 2]

For each length, `--layers` separate paged caches (enough to fall out of the L3 cache, as a decode
step's layers do) are attended in turn, best of `--reps` passes, in microseconds per layer: the
calling thread alone, then the compute pool (where a lone sequence's positions are split between
the threads). Random values; the speed does not depend on them. Not a unit test.
"""
from __future__ import annotations

import argparse
import time

import torch

from strata import native

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def per_layer_us(n: int, a: argparse.Namespace, pool) -> float:
    P = 16
    N = (n + P - 1) // P
    caches = [(torch.randn(N, a.kv_heads, P, a.head_dim).to(DTYPES[a.kv_type]),
               torch.randn(N, a.kv_heads, P, a.head_dim).to(DTYPES[a.kv_type])) for _ in range(a.layers)]
    table = torch.randperm(N, generator=torch.Generator().manual_seed(0))[None, :].contiguous()
    n_ctx = torch.tensor([n], dtype=torch.int64)
    q, out = torch.randn(1, a.heads, a.head_dim), torch.empty(1, a.heads * a.head_dim)
    best = float("inf")
    for _ in range(a.reps):
        t = time.perf_counter()
        for k, v in caches:
            native.attn_decode(q, k, v, table, n_ctx, a.head_dim ** -0.5, out, pool=pool)
        best = min(best, time.perf_counter() - t)
    return best / a.layers * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--positions", type=int, nargs="+", default=[560, 4000])
    p.add_argument("--kv-type", choices=sorted(DTYPES), default="f32")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=96)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    with native.ComputePool(a.threads) as pool:
        for n in a.positions:
            print(f"{n} positions, {a.heads} heads on {a.kv_heads} kv heads of {a.head_dim}, {a.kv_type}: "
                  f"serial {per_layer_us(n, a, None):.1f} us/layer, pool of {a.threads} "
                  f"{per_layer_us(n, a, pool):.1f} us/layer")


if __name__ == "__main__":
    main()
