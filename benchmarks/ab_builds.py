"""Two builds of the native library side by side in one process: each kernel's time per call in
build A and build B, calls alternating, so that a machine whose speed drifts (the shared machines
here move 2x within minutes) drifts under both alike.

    python benchmarks/ab_builds.py A.so B.so [--types IQ2_XS IQ3_S ...] [--tokens 1 64]
                                   [--rows 256] [--k 4096] [--rounds 200] [--impl avx512]

Make the two libraries by building each version (`python build.py`) and copying
strata/_native*.so aside. Per type and token count: random packed weights [rows, k] and random
activations; `strata_qdot_rows` (one thread: the kernel the table picks for --impl, activations
quantized in the call) called through ctypes from each library in turn, ABAB then BABA; thread
CPU time per call. Prints the best and the median of each, their ratio A / B (above 1: B is
faster), and whether the two outputs are equal bit for bit. Not a test.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from strata.quant import block_size, ggml_type, random_blocks  # noqa: E402

IMPLS = {"auto": 0, "scalar": 1, "avx2": 2, "avx512": 3}  # strata.h's STRATA_IMPL_*
I64, VP = ctypes.c_int64, ctypes.c_void_p


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    return a.ctypes.data_as(VP)


def compare(libs: dict, name: str, n_tok: int, a: argparse.Namespace, rng: np.random.Generator) -> str:
    t = ggml_type(name)
    w = np.frombuffer(random_blocks(t, a.rows * a.k // block_size(t)[0], rng, 0.01), np.uint8).copy()
    x = rng.standard_normal((n_tok, a.k), dtype=np.float32)
    y = np.empty((n_tok, a.rows), np.float32)
    need = I64()
    if libs["A"].strata_qdot_scratch_bytes(int(t), I64(n_tok), I64(a.k), ctypes.byref(need)):
        raise SystemExit(f"{name}: no kernel for {a.k} values per row")
    scratch = np.empty(max(need.value, 1), np.uint8)
    args = (int(t), ptr(w), I64(w.nbytes), I64(a.rows), I64(a.k), ptr(x), I64(x.nbytes), I64(n_tok), ptr(y),
            I64(y.nbytes), ptr(scratch), I64(scratch.nbytes), IMPLS[a.impl])
    times: dict[str, list[int]] = {"A": [], "B": []}
    out = {}
    for r in range(a.rounds):
        for build in ("A", "B") if r % 2 == 0 else ("B", "A"):
            t0 = time.thread_time_ns()
            status = libs[build].strata_qdot_rows(*args)
            times[build].append(time.thread_time_ns() - t0)
            if status:
                raise SystemExit(f"{name}: build {build} returned status {status}")
            out[build] = y.copy()
    same = np.array_equal(out["A"].view(np.uint32), out["B"].view(np.uint32))
    best = {b: min(v) / 1e3 for b, v in times.items()}
    med = {b: statistics.median(v) / 1e3 for b, v in times.items()}
    return (f"{name:8} x{n_tok:<4} best A {best['A']:8.1f} us  B {best['B']:8.1f} us = {best['A'] / best['B']:5.3f}x"
            f"   median {med['A']:8.1f} / {med['B']:8.1f} = {med['A'] / med['B']:5.3f}x   bit-equal: {same}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--types", nargs="+", default=["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"])
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 64])
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--impl", choices=sorted(IMPLS), default="auto")
    a = p.parse_args()
    libs = {"A": ctypes.CDLL(str(a.a.resolve())), "B": ctypes.CDLL(str(a.b.resolve()))}
    rng = np.random.default_rng(0)
    print(f"A = {a.a}, B = {a.b}; {a.rows} x {a.k}, {a.impl} kernels, {a.rounds} calls each", flush=True)
    for n_tok in a.tokens:
        for name in a.types:
            print(compare(libs, name, n_tok, a, rng), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
