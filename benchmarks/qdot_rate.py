"""Rate of the quantized matrix kernels at decode (one token): nanoseconds per 32-weight row block
and bytes of weights read per second, on random packed weights, in cache and from DRAM.

    python benchmarks/qdot_rate.py [--types Q4_0 Q8_0 Q4_K] [--threads 1 2]

Per type: a 2048 x 1024 matrix (a few MB: the CPU's caches) and a 65536 x 1024 one (tens of MB:
from DRAM), 1 token, through the pooled `native.matmul_into` at each thread count; best of 5
rounds. Figures vary with machine load: compare only inside one run. Not a test.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from strata import native
from strata.quant import block_size, ggml_type, random_blocks


def rate(pool: native.ComputePool, name: str, n: int, k: int, rng: np.random.Generator) -> tuple[float, float]:
    t = ggml_type(name)
    w = torch.from_numpy(random_blocks(t, n * k // block_size(t)[0], rng).view(np.uint8).reshape(-1))
    x, y = torch.randn(1, k), torch.empty(1, n)
    scratch = torch.empty(max(native.matmul_scratch_bytes(name, 1, k), 64), dtype=torch.uint8)
    reps, best = max(3, int(3e8 / w.numel())), float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            native.matmul_into(pool, name, w, n, k, x, y, scratch)
        best = min(best, (time.perf_counter() - t0) / reps)
    return best * 1e9 / (n * k / 32), w.numel() / best / 1e9


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", nargs="+", default=["Q4_0", "Q8_0", "Q4_K"])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    a = p.parse_args()
    rng = np.random.default_rng(0)
    for threads in a.threads:
        with native.ComputePool(threads) as pool:
            for name in a.types:
                for n in (2048, 65536):
                    ns, gbs = rate(pool, name, n, 1024, rng)
                    print(f"{threads} thread(s) {name:5} {n:6d} x 1024: {ns:6.2f} ns per 32-weight row block, "
                          f"{gbs:5.1f} GB/s of weights", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
