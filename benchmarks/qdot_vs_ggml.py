"""Strata's packed kernels beside llama.cpp's matrix multiply on the same bytes, same threads,
interleaved: the kernel-level half of `packed_vs_llama.py`, free of everything else a model does.

    python benchmarks/qdot_vs_ggml.py [--types IQ2_XS IQ3_S ...] [--threads 1 2] [--tokens 1 64]
                                      [--rows 1024] [--k 4096] [--alternate 5] [--repack]

Per type, token count and thread count: one random packed matrix [rows, k] of the type
(benchmarks/qdot_rate.py's Matrix) and random activations. Strata multiplies through
`native.matmul_into` on a pool of `threads` (the kernel its table picks for this machine and the
phase); llama.cpp through ggml itself (the libraries llama-cpp-python ships): a graph of one
`ggml_mul_mat` of a tensor holding the same bytes, computed by `ggml_graph_compute` with `threads`.
Both quantize the activations as part of the call. Each figure is the best over --alternate rounds
in which the two run in turn (5 timed calls each), as GB/s of packed weights per token, with the
ratio Strata / llama.cpp; the two outputs are compared (largest difference relative to the largest
output) so that both compute the same product.

llama.cpp proper copies some types into interleaved rows at load (its CPU_REPACK buffer type; on
x86: Q4_0, Q4_K, IQ4_NL and MXFP4 with AVX2, Q2_K with AVX-512). By default the ggml tensor holds
the file's rows as they are; `--repack` puts it in that buffer type instead (ggml repacks the bytes
as they are set, as when llama.cpp loads a file), so the figure is llama.cpp's repacked kernel
against Strata's kernel on the file's rows: what an interleaved copy buys. AMX kernels are not
measured. For the types llama.cpp does not repack (the grid i-quants, IQ4_XS, Q3_K, Q5_K, Q6_K, TQ*
on x86) the plain graph is the code llama.cpp runs. Not a test.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

ROOT_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT_DIR))
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
                            ("ggml_build_forward_expand", None, [vp, vp]), ("ggml_get_data", vp, [vp]),
                            ("ggml_backend_reg_dev_get", vp, [vp, ctypes.c_size_t]),
                            ("ggml_backend_reg_get_proc_address", vp, [vp, ctypes.c_char_p]),
                            ("ggml_backend_buft_name", ctypes.c_char_p, [vp]),
                            ("ggml_backend_alloc_ctx_tensors_from_buft", vp, [vp, vp]),
                            ("ggml_backend_buffer_set_usage", None, [vp, ctypes.c_int]),
                            ("ggml_backend_buffer_free", None, [vp]),
                            ("ggml_backend_tensor_set", None, [vp, vp, ctypes.c_size_t, ctypes.c_size_t])]:
        fn = getattr(base, name)
        fn.restype, fn.argtypes = res, args
    cpu.ggml_backend_cpu_reg.restype, cpu.ggml_backend_cpu_reg.argtypes = vp, []
    cpu.ggml_graph_plan.restype, cpu.ggml_graph_plan.argtypes = _Cplan, [vp, ctypes.c_int, vp]
    cpu.ggml_graph_compute.restype, cpu.ggml_graph_compute.argtypes = ctypes.c_int, [vp, ctypes.POINTER(_Cplan)]
    cpu.ggml_cpu_init()
    return base, cpu


def repack_refusal(name: str, rows: int) -> str | None:
    """Why llama.cpp would not repack a [rows, k] matrix of type `name` on this CPU (its
    ggml_repack_get_optimal_repack_type on x86), or None. ggml's repacking buffer dereferences the
    repack it did not find, so such a matrix must never reach it."""
    repacked = {"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"} if native.cpu_has_avx2() else set()
    if native.cpu_has_avx512():
        repacked.add("Q2_K")
    if name not in repacked:
        return f"--repack: llama.cpp does not repack {name} on this CPU (it repacks: {', '.join(sorted(repacked)) or 'none'})"
    if rows % 8:
        return f"--repack: llama.cpp repacks whole groups of 8 rows; --rows {rows} is not a multiple of 8"
    return None


def repack_buffer_type(libs: tuple[ctypes.CDLL, ctypes.CDLL]) -> int:
    """ggml's CPU_REPACK buffer type (one of the CPU device's extra buffer types)."""
    base, cpu = libs
    reg = cpu.ggml_backend_cpu_reg()
    dev = base.ggml_backend_reg_dev_get(reg, 0)
    get = base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    if not get:
        raise RuntimeError("this ggml has no extra buffer types")
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(get)(dev)
    names = []
    for i in range(16):
        if not bufts[i]:
            break
        names.append(base.ggml_backend_buft_name(bufts[i]).decode())
        if names[-1] == "CPU_REPACK":
            return bufts[i]
    raise RuntimeError(f"no CPU_REPACK buffer type in this ggml (extra buffer types: {names})")


class GgmlMatmul:
    """m's product computed by ggml: y = x @ w.T with w in a ggml tensor of m's bytes (in the
    buffer type `buft` when given: CPU_REPACK interleaves the rows as the bytes are set)."""

    def __init__(self, libs: tuple[ctypes.CDLL, ctypes.CDLL], m: Matrix, threads: int, buft: int | None = None):
        self.base, self.cpu = libs
        n_tok = m.x.shape[0]
        size = m.w.numel() + 4 * (m.x.numel() + m.y.numel()) + (16 << 20)
        self.ctx = self.base.ggml_init(_InitParams(size, None, False))
        self.w_ctx = self.w_buf = None
        if buft is None:
            w = self.base.ggml_new_tensor_2d(self.ctx, int(ggml_type(m.name)), m.k, m.n)
            ctypes.memmove(self.base.ggml_get_data(w), m.w.data_ptr(), m.w.numel())
        else:
            self.w_ctx = self.base.ggml_init(_InitParams(1 << 20, None, True))
            w = self.base.ggml_new_tensor_2d(self.w_ctx, int(ggml_type(m.name)), m.k, m.n)
            self.w_buf = self.base.ggml_backend_alloc_ctx_tensors_from_buft(self.w_ctx, buft)
            self.base.ggml_backend_buffer_set_usage(self.w_buf, 1)  # GGML_BACKEND_BUFFER_USAGE_WEIGHTS
            self.base.ggml_backend_tensor_set(w, m.w.data_ptr(), 0, m.w.numel())
        x = self.base.ggml_new_tensor_2d(self.ctx, 0, m.k, n_tok)  # GGML_TYPE_F32
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
        if self.w_ctx:
            self.base.ggml_backend_buffer_free(self.w_buf)
            self.base.ggml_free(self.w_ctx)


def compare(libs, pool, threads: int, name: str, n_tok: int, a: argparse.Namespace, rng) -> str:
    if a.repack and (why := repack_refusal(name, a.rows)):
        raise ValueError(why)
    m = Matrix(name, a.rows, a.k, n_tok, rng)
    g = GgmlMatmul(libs, m, threads, repack_buffer_type(libs) if a.repack else None)
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
    p.add_argument("--repack", action="store_true",
                   help="llama.cpp's weights in its CPU_REPACK buffer (interleaved rows, as llama.cpp loads them); "
                        "only for the types it repacks on this CPU")
    a = p.parse_args()
    for name in a.types if a.repack else ():
        if why := repack_refusal(name, a.rows):
            p.error(why)
    libs, rng = ggml_libs(), np.random.default_rng(0)
    print(f"strata kernels: {native.default_impl()}; matrix {a.rows} x {a.k}; llama.cpp's weights "
          f"{'repacked (CPU_REPACK)' if a.repack else 'as in the file'}", flush=True)
    for threads in a.threads:
        with native.ComputePool(threads) as pool:
            for name in a.types:
                for n_tok in a.tokens:
                    print(compare(libs, pool, threads, name, n_tok, a, rng), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
