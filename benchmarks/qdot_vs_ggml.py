"""Strata's packed kernels beside llama.cpp's matrix multiply on the same bytes, same threads,
interleaved: the kernel-level half of `packed_vs_llama.py`, free of everything else a model does.

    python benchmarks/qdot_vs_ggml.py [--types IQ2_XS IQ3_S ...] [--threads 1 2] [--tokens 1 64]
                                      [--rows 1024] [--k 4096] [--alternate 5]

Per type, token count and thread count: one random packed matrix [rows, k] of the type
(benchmarks/qdot_rate.py's Matrix) and random activations. Strata multiplies through
`native.matmul_into` on a pool of `threads` (the kernel its table picks for this machine and the
phase); llama.cpp through ggml itself (the libraries llama-cpp-python ships): a graph of one
`ggml_mul_mat` of a tensor holding the same bytes, computed by `ggml_graph_compute` with `threads`.
Both quantize the activations as part of the call. Each figure is the best over --alternate rounds
in which the two run in turn (5 timed calls each), as GB/s of packed weights per token, with the
ratio Strata / llama.cpp; the two outputs are compared (largest difference relative to the largest
output) so that both compute the same product.

What this does not measure: llama.cpp's repacked rows (REPACK: Q4_0, Q4_K, IQ4_NL, Q8_0 are copied
into interleaved rows at load by llama.cpp proper, not by a bare ggml graph) and its AMX kernels;
`packed_vs_llama.py` runs llama.cpp as users do. For the other types (the grid i-quants, IQ4_XS,
Q2_K, Q3_K, Q5_K, Q6_K, TQ*) this is the code llama.cpp runs. Not a test.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.qdot_rate import Matrix, best_seconds  # noqa: E402
from strata import native  # noqa: E402
from strata.quant import ggml_type  # noqa: E402

DEFAULT_TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_XS", "Q2_K", "Q3_K", "TQ1_0"]


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class _Cplan(ctypes.Structure):  # ggml-cpu.h's struct ggml_cplan
    _fields_ = [("work_size", ctypes.c_size_t), ("work_data", ctypes.c_void_p), ("n_threads", ctypes.c_int),
                ("threadpool", ctypes.c_void_p), ("abort_callback", ctypes.c_void_p),
                ("abort_callback_data", ctypes.c_void_p), ("use_ref", ctypes.c_bool)]


def ggml_libs() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """ggml's base and CPU libraries from the installed llama-cpp-python, with the calls used here typed."""
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib"
    base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    for name, res, args in [("ggml_init", vp, [_InitParams]), ("ggml_free", None, [vp]),
                            ("ggml_new_tensor_2d", vp, [vp, ctypes.c_int, i64, i64]),
                            ("ggml_mul_mat", vp, [vp, vp, vp]), ("ggml_new_graph", vp, [vp]),
                            ("ggml_build_forward_expand", None, [vp, vp]), ("ggml_get_data", vp, [vp])]:
        fn = getattr(base, name)
        fn.restype, fn.argtypes = res, args
    cpu.ggml_graph_plan.restype, cpu.ggml_graph_plan.argtypes = _Cplan, [vp, ctypes.c_int, vp]
    cpu.ggml_graph_compute.restype, cpu.ggml_graph_compute.argtypes = ctypes.c_int, [vp, ctypes.POINTER(_Cplan)]
    cpu.ggml_cpu_init()
    return base, cpu


class GgmlMatmul:
    """m's product computed by ggml: y = x @ w.T with w in a ggml tensor of m's bytes."""

    def __init__(self, libs: tuple[ctypes.CDLL, ctypes.CDLL], m: Matrix, threads: int):
        self.base, self.cpu = libs
        n_tok = m.x.shape[0]
        size = m.w.numel() + 4 * (m.x.numel() + m.y.numel()) + (16 << 20)
        self.ctx = self.base.ggml_init(_InitParams(size, None, False))
        w = self.base.ggml_new_tensor_2d(self.ctx, int(ggml_type(m.name)), m.k, m.n)
        x = self.base.ggml_new_tensor_2d(self.ctx, 0, m.k, n_tok)  # GGML_TYPE_F32
        ctypes.memmove(self.base.ggml_get_data(w), m.w.data_ptr(), m.w.numel())
        ctypes.memmove(self.base.ggml_get_data(x), m.x.data_ptr(), 4 * m.x.numel())
        self.out = self.base.ggml_mul_mat(self.ctx, w, x)
        self.graph = self.base.ggml_new_graph(self.ctx)
        self.base.ggml_build_forward_expand(self.graph, self.out)
        self.plan = self.cpu.ggml_graph_plan(self.graph, threads, None)
        self.work = ctypes.create_string_buffer(max(self.plan.work_size, 1))
        self.plan.work_data = ctypes.cast(self.work, ctypes.c_void_p)
        self.shape = (n_tok, m.n)

    def run(self) -> None:
        if self.cpu.ggml_graph_compute(self.graph, ctypes.byref(self.plan)) != 0:
            raise RuntimeError("ggml_graph_compute failed")

    def result(self) -> np.ndarray:
        ptr = ctypes.cast(self.base.ggml_get_data(self.out), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(ptr, shape=self.shape).copy()

    def close(self) -> None:
        self.base.ggml_free(self.ctx)


def compare(libs, pool, threads: int, name: str, n_tok: int, a: argparse.Namespace, rng) -> str:
    m = Matrix(name, a.rows, a.k, n_tok, rng)
    g = GgmlMatmul(libs, m, threads)
    try:
        m.run(pool, native.default_impl())
        g.run()
        ref = g.result()
        diff = float(np.abs(m.y.numpy() - ref).max() / max(np.abs(ref).max(), 1e-30))
        best = {"strata": 0.0, "llama.cpp": 0.0}
        for _ in range(a.alternate):
            for engine, fn in (("strata", lambda: m.run(pool, native.default_impl())), ("llama.cpp", g.run)):
                best[engine] = max(best[engine], m.w.numel() * n_tok / best_seconds(fn, 5) / 1e9)
    finally:
        g.close()
    phase = "decode " if n_tok == 1 else f"x{n_tok:<6}"
    return (f"{threads}T {name:7} {phase} strata {best['strata']:6.1f} GB/s  llama.cpp {best['llama.cpp']:6.1f} GB/s"
            f"  = {best['strata'] / best['llama.cpp']:4.2f}x   (outputs differ by {diff:.1e})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", nargs="+", default=DEFAULT_TYPES)
    p.add_argument("--threads", nargs="+", type=int, default=[1])
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 64])
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--alternate", type=int, default=5, metavar="N")
    a = p.parse_args()
    libs, rng = ggml_libs(), np.random.default_rng(0)
    print(f"strata kernels: {native.default_impl()}; matrix {a.rows} x {a.k}", flush=True)
    for threads in a.threads:
        with native.ComputePool(threads) as pool:
            for name in a.types:
                for n_tok in a.tokens:
                    print(compare(libs, pool, threads, name, n_tok, a, rng), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
