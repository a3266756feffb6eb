"""Rate of the quantized matrix kernels per type and kernel family (scalar, avx2): bytes of packed
weights read per second at decode (one token) in cache and from DRAM, the DRAM rate as a share of
a bare read of the same bytes by as many threads, and prefill against decode per token.

    python benchmarks/qdot_rate.py [--types Q4_0 Q4_K IQ4_NL ...] [--impls scalar avx2] [--threads 2]
                                   [--dram-mib N] [--prefill-tokens 64] [--rounds 15] [--alternate N]

Per type, through the pooled `native.matmul_into` on random packed weights:
  cache    1 token by a 2048 x 2048 matrix (at most 4.5 MB: the L3)
  DRAM     1 token by an N x 4096 matrix of --dram-mib MiB (default: four times the largest cache
           the kernel reports, at least 256 MiB and at most a quarter of the free memory; a host
           with a 300 MiB L3 read a 256 MiB matrix out of its L3 at twice its DRAM's rate)
  prefill  --prefill-tokens tokens by a 1024 x 4096 matrix; "x decode" is decode's time per token
           on the same matrix over prefill's
  bare read: torch's sum of the DRAM matrix's bytes as int64 with the same thread count, measured
           right before each DRAM figure (the share is of the better of the two bare reads around it)
--alternate N compares the families instead (e.g. `--impls avx2 avx512 --alternate 3`): each case's
best over N rounds that run every family in turn, and the ratio last / first. An AVX-512 call runs
the AVX2 tile where the table of quant types says so (strata/quant_table.py); STRATA_KERNEL=+avx512
makes it run AVX-512's own everywhere, the measurement that table records.
Each figure is the best of --rounds short rounds (a shared machine is noisy: compare only inside
one run, and rerun for a range). GB/s count packed weight bytes; prefill's count them once per
token. Not a test.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch

from strata import native
from strata.quant import block_size, ggml_type, random_blocks

DEFAULT_TYPES = ["Q4_0", "Q8_0", "Q4_K", "IQ4_NL", "IQ4_XS", "TQ2_0", "TQ1_0", "NVFP4"]


class Matrix:
    """Random packed weights [n, k] of one type, with its activations, output and scratch."""

    def __init__(self, name: str, n: int, k: int, n_tokens: int, rng: np.random.Generator):
        t = ggml_type(name)
        self.name, self.n, self.k = name, n, k
        self.w = torch.from_numpy(random_blocks(t, n * k // block_size(t)[0], rng).view(np.uint8).reshape(-1))
        self.x, self.y = torch.randn(n_tokens, k), torch.empty(n_tokens, n)
        self.scratch = torch.empty(max(native.matmul_scratch_bytes(name, n_tokens, k), 64), dtype=torch.uint8)

    def run(self, pool: native.ComputePool, impl: str) -> None:
        native.matmul_into(pool, self.name, self.w, self.n, self.k, self.x, self.y, self.scratch, impl=impl)


def best_seconds(fn, rounds: int, min_s: float = 0.02) -> float:
    """Best time of one call of fn over `rounds` rounds of enough calls to last min_s."""
    t0 = time.perf_counter()
    fn()
    reps = max(1, int(min_s / max(time.perf_counter() - t0, 1e-9)))
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def bare_read_gbs(buf: torch.Tensor, threads: int, rounds: int) -> float:
    """GB/s of torch summing `buf`'s bytes as int64 on `threads` threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        words = buf[: buf.numel() // 8 * 8].view(torch.int64)
        return buf.numel() / best_seconds(words.sum, rounds) / 1e9
    finally:
        torch.set_num_threads(before)


def largest_cache_bytes() -> int:
    """Size of the largest CPU cache sysfs lists for cpu0, 0 where it lists none."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=0)


def default_dram_mib(cache_mib: int) -> int:
    """Four times the largest cache, at least 256 MiB, at most a quarter of the available memory."""
    want = max(256, 4 * cache_mib)
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    except (ValueError, OSError):
        return want
    return max(64, min(want, avail // 4))


def matrices(name: str, a: argparse.Namespace, rng) -> dict[str, Matrix]:
    """The cache, decode, prefill and DRAM matrices of one type."""
    mid = Matrix(name, 1024, 4096, 1, rng)
    n_dram = max(1, a.dram_mib * 2**20 // (mid.w.numel() // 1024))  # rows of 4096 in --dram-mib MiB
    return {"cache": Matrix(name, 2048, 2048, 1, rng), "decode": mid,
            "prefill": Matrix(name, 1024, 4096, a.prefill_tokens, rng), "dram": Matrix(name, n_dram, 4096, 1, rng)}


def measure(pool, threads: int, m: dict[str, Matrix], impl: str, a: argparse.Namespace) -> str:
    """One report line for the type of `m` run by family `impl`."""
    def gbs(key: str, rounds: int = a.rounds) -> float:
        return m[key].w.numel() * m[key].x.shape[0] / best_seconds(lambda: m[key].run(pool, impl), rounds) / 1e9

    cache, decode, prefill = gbs("cache"), gbs("decode"), gbs("prefill", max(3, a.rounds // 3))
    bare = bare_read_gbs(m["dram"].w, threads, a.rounds)
    dram = gbs("dram")
    bare = max(bare, bare_read_gbs(m["dram"].w, threads, a.rounds))
    return (f"{threads}T {m['dram'].name:7} {impl:6} cache {cache:6.1f} GB/s | DRAM {dram:5.1f} GB/s = "
            f"{100 * dram / bare:4.0f}% of bare read {bare:5.1f} | prefill x{a.prefill_tokens} "
            f"{prefill:6.1f} GB/s, x{prefill / decode:5.1f} decode per token")


def alternate(pool, threads: int, m: dict[str, Matrix], impls: list[str], a: argparse.Namespace) -> str:
    """One line comparing families: each case's best GB/s over --alternate rounds in which every
    family runs in turn (a noisy machine's drift then reaches every family alike)."""
    best: dict[tuple[str, str], float] = {}
    for _ in range(a.alternate):
        for impl in impls:
            for key in ("cache", "dram", "prefill"):
                rate = m[key].w.numel() * m[key].x.shape[0] / best_seconds(lambda: m[key].run(pool, impl), 5) / 1e9
                best[impl, key] = max(best.get((impl, key), 0.0), rate)
    cells = [f"{key} " + " ".join(f"{impl} {best[impl, key]:5.1f}" for impl in impls)
             + f" ({best[impls[-1], key] / best[impls[0], key]:.2f}x)" for key in ("cache", "dram", "prefill")]
    return f"{threads}T {m['dram'].name:7} " + " | ".join(cells)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", nargs="+", default=DEFAULT_TYPES)
    p.add_argument("--impls", nargs="+", default=["scalar", "avx2"] if native.cpu_has_avx2() else ["scalar"])
    p.add_argument("--threads", nargs="+", type=int, default=[2])
    p.add_argument("--dram-mib", type=int, default=None,
                   help="size of the DRAM matrix (default: 4x the largest cache, see above)")
    p.add_argument("--prefill-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--alternate", type=int, default=0, metavar="N",
                   help="compare the families instead: N rounds, each running every family in turn")
    a = p.parse_args()
    cache_mib = largest_cache_bytes() // 2**20
    if a.dram_mib is None:
        a.dram_mib = default_dram_mib(cache_mib)
    print(f"DRAM matrix {a.dram_mib} MiB (largest cache {cache_mib} MiB)", flush=True)
    rng = np.random.default_rng(0)
    for threads in a.threads:
        with native.ComputePool(threads) as pool:
            for name in a.types:
                m = matrices(name, a, rng)
                if a.alternate:
                    print(alternate(pool, threads, m, a.impls, a), flush=True)
                    continue
                for impl in a.impls:
                    print(measure(pool, threads, m, impl, a), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
