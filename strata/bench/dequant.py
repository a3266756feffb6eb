"""`strata bench dequant`: GB/s of every dequantization kernel beside gguf.quants and a memcpy.

Each figure is measured beside its reference in the same run, since these machines are noisy.

Must not print or assert: it returns data and `strata.commands.bench` prints it.
"""
from __future__ import annotations

import time

import numpy as np

from strata.units import MIB


def best_seconds(fn, repeat: int) -> float:
    """The fastest of `repeat` timed calls of `fn`, after one warm-up call."""
    fn()  # warm-up: page in buffers, start threads once
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_dequant(out_mib: int = 64, repeat: int = 3, threads: int | None = None,
                  types: list | None = None) -> dict[str, dict[str, float]]:
    """GB/s of float32 output for each format: native AVX2 (1 thread, all threads), native scalar,
    gguf.quants (numpy), and a plain memory copy of the same output bytes (the ceiling)."""
    from gguf import quants as gguf_quants

    from strata import native
    from strata.quant import DEQUANT_TYPES, block_size, ggml_type, random_blocks

    threads = threads or native.default_threads()
    rng = np.random.default_rng(0)
    n_elems = out_mib * MIB // 4
    row_len = 4096
    n_rows = n_elems // row_len
    out = np.empty((n_rows, row_len), dtype=np.float32)
    copy_src = np.ones_like(out)
    gbytes = out.nbytes / 1e9
    copy_gbs = gbytes / best_seconds(lambda: np.copyto(out, copy_src), repeat)

    selected = [ggml_type(t) for t in types] if types else list(DEQUANT_TYPES)
    results: dict[str, dict[str, float]] = {}
    for t in selected:
        elems, nbytes = block_size(t)
        packed = random_blocks(t, n_elems // elems, rng)
        packed_2d = packed.reshape(n_rows, -1)

        def native_run(impl: str, n_threads: int) -> float:
            secs = best_seconds(lambda: native.dequantize_into(t, packed, out, n_threads=n_threads, impl=impl), repeat)
            return gbytes / secs

        row: dict[str, float] = {}
        if native.cpu_has_avx2():
            row["avx2_1t"] = native_run("avx2", 1)
            row[f"avx2_{threads}t"] = native_run("avx2", threads)
            row["avx2_kernel"] = float(native.has_kernel(t, "avx2"))
        row["scalar_1t"] = native_run("scalar", 1)

        def gguf_run():
            result = gguf_quants.dequantize(packed_2d, t)
            if np.shares_memory(result, packed_2d):  # F32 comes back as a view: count the copy
                result = result.copy()
            return result

        row["gguf_quants"] = gbytes / best_seconds(gguf_run, max(1, repeat - 2))
        row["memcpy"] = copy_gbs
        if "avx2_1t" in row:
            row["avx2_1t_vs_gguf"] = row["avx2_1t"] / row["gguf_quants"]
            row["avx2_1t_vs_memcpy"] = row["avx2_1t"] / copy_gbs
        results[t.name] = row
    return results
