"""`strata bench`: measurements, never assertions. Each figure is measured beside its reference
in the same run, since these machines are noisy."""
from __future__ import annotations

import argparse
import json
import time

import numpy as np


def _best_seconds(fn, repeat: int) -> float:
    fn()  # warm-up: page in buffers, start threads once
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_dequant(out_mib: int = 64, repeat: int = 3, threads: int | None = None,
                  types: list[str] | None = None) -> dict[str, dict[str, float]]:
    """GB/s of float32 output for each format: native AVX2 (1 thread, all threads), native scalar,
    gguf.quants (numpy), and a plain memory copy of the same output bytes (the ceiling)."""
    from gguf import quants as gguf_quants

    from strata import native
    from strata.quant import DEQUANT_TYPES, block_size, ggml_type, random_blocks

    threads = threads or native.default_threads()
    rng = np.random.default_rng(0)
    n_elems = out_mib * 2**20 // 4
    row_len = 4096
    n_rows = n_elems // row_len
    out = np.empty((n_rows, row_len), dtype=np.float32)
    copy_src = np.ones_like(out)
    gbytes = out.nbytes / 1e9
    copy_gbs = gbytes / _best_seconds(lambda: np.copyto(out, copy_src), repeat)

    selected = [ggml_type(t) for t in types] if types else list(DEQUANT_TYPES)
    results: dict[str, dict[str, float]] = {}
    for t in selected:
        elems, nbytes = block_size(t)
        packed = random_blocks(t, n_elems // elems, rng)
        packed_2d = packed.reshape(n_rows, -1)

        def native_run(impl: str, n_threads: int) -> float:
            secs = _best_seconds(lambda: native.dequantize_into(t, packed, out, n_threads=n_threads, impl=impl), repeat)
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

        row["gguf_quants"] = gbytes / _best_seconds(gguf_run, max(1, repeat - 2))
        row["memcpy"] = copy_gbs
        if "avx2_1t" in row:
            row["avx2_1t_vs_gguf"] = row["avx2_1t"] / row["gguf_quants"]
            row["avx2_1t_vs_memcpy"] = row["avx2_1t"] / copy_gbs
        results[t.name] = row
    return results


def _print_dequant(results: dict[str, dict[str, float]]) -> None:
    cols = [c for c in next(iter(results.values())) if c != "avx2_kernel"]
    print(f"GB/s of float32 output ({'  '.join(cols)})")
    print(f"{'format':<8}" + "".join(f"{c:>18}" for c in cols))
    for name, row in results.items():
        mark = "" if row.get("avx2_kernel", 1.0) else "  (no AVX2 kernel: scalar)"
        print(f"{name:<8}" + "".join(f"{row[c]:>18.2f}" for c in cols) + mark)


def _run_dequant(args: argparse.Namespace) -> int:
    results = bench_dequant(out_mib=args.mib, repeat=args.repeat, threads=args.threads, types=args.types)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        _print_dequant(results)
    return 0


def _format_arg(name: str):
    from strata.quant import DEQUANT_TYPES, ggml_type

    try:
        t = ggml_type(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if t not in DEQUANT_TYPES:
        raise argparse.ArgumentTypeError(f"{t.name} is not a format Strata dequantizes")
    return t


def _run_cache(args: argparse.Namespace) -> int:
    from strata.memory.trace import bench_cache, format_cache

    result = bench_cache(args.trace, args.slots, args.prefetch_depth, args.prefetch_margin)
    print(json.dumps(result, indent=2) if args.json else format_cache(result))
    return 0


def _add_cache_parser(sub) -> None:
    c = sub.add_parser("cache", help="replay a routing trace through the expert placement policy, "
                                     "beside LRU, the best fixed hot set and Belady's optimal")
    c.add_argument("--trace", required=True, help="routing trace (.npz with indices [layers, tokens, k])")
    c.add_argument("--slots", type=int, nargs="+", default=[8, 16, 32], help="expert slots per layer (default 8 16 32)")
    c.add_argument("--prefetch-depth", type=int, default=1, help="layers ahead to predict and prefetch; 0: off (default 1)")
    c.add_argument("--prefetch-margin", type=float, default=None,
                   help="a prefetch of probability p displaces only experts worth less than p/margin (default 8)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=_run_cache)


def _run_pager(args: argparse.Namespace) -> int:
    from strata.memory.pager_bench import bench_pager, format_pager

    result = bench_pager(args.file, n_threads=args.threads, depth=args.depth, chunk_bytes=args.chunk_kib * 1024,
                         repeat=args.repeat, host=not args.no_host)
    print(json.dumps(result, indent=2) if args.json else format_pager(result))
    return 0


def _add_pager_parser(sub) -> None:
    p = sub.add_parser("pager", help="GB/s of the pager reading a GGUF's expert slabs in random order, "
                                     "beside the disk's sequential O_DIRECT rate on the same file")
    p.add_argument("file", help="GGUF model file (benchmarks/pager_read.py writes a synthetic one)")
    p.add_argument("--threads", type=int, default=4, help="pager worker threads (default 4)")
    p.add_argument("--depth", type=int, default=16, help="slabs in flight (default 16)")
    p.add_argument("--chunk-kib", type=int, default=0, help="largest single read in KiB (default: the pager's, 1024)")
    p.add_argument("--repeat", type=int, default=3, help="alternating sequential/pager pass pairs (default 3)")
    p.add_argument("--no-host", action="store_true", help="skip the host-tier figure")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run_pager)


def _run_tiered(args: argparse.Namespace) -> int:
    from strata.tiered_bench import bench_tiered, format_tiered

    result = bench_tiered(args.model, depths=args.depths, tokens=args.tokens, repeat=args.repeat,
                          temperature=args.temperature, seed=args.seed, device=args.device, dtype=args.dtype,
                          threads=args.threads, n_ctx=args.ctx, device_mem=args.device_mem, host_mem=args.host_mem,
                          slot_form=args.slot_form)
    print(json.dumps(result, indent=2) if args.json else format_tiered(result))
    return 0


def _add_tiered_parser(sub) -> None:
    t = sub.add_parser("tiered", help="decode through the tiered expert memory with prefetch off and on: hits, "
                                      "bytes moved, time waited for experts, prefetch precision and recall")
    t.add_argument("model", help="GGUF model file")
    t.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    t.add_argument("--dtype", default=None, help="compute dtype (default float32 on cpu, bfloat16 on cuda)")
    t.add_argument("--threads", type=int, default=None, help="CPU threads (default: all available)")
    t.add_argument("--ctx", type=int, default=256, help="context length (default 256)")
    t.add_argument("--device-mem", default=None, metavar="SIZE", help="device budget, e.g. 2G (default: the machine's)")
    t.add_argument("--host-mem", default=None, metavar="SIZE", help="host budget, e.g. 8G (default: the machine's)")
    t.add_argument("--slot-form", choices=("dequantized", "packed"), default=None, help="device slot form")
    t.add_argument("--depths", type=int, nargs="+", default=[0, 2], help="prefetch depths to compare (default 0 2)")
    t.add_argument("--tokens", type=int, default=64, help="tokens decoded per run (default 64)")
    t.add_argument("--repeat", type=int, default=1, help="runs per depth, alternating (default 1)")
    t.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1: varied text)")
    t.add_argument("--seed", type=int, default=0, help="prompt and sampling seed")
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.set_defaults(func=_run_tiered)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="measure speed and hit rates (dequantization, expert cache, ...)")
    sub = p.add_subparsers(dest="bench_command", required=True)
    d = sub.add_parser("dequant", help="GB/s of every dequantization kernel against gguf.quants and memcpy")
    d.add_argument("--json", action="store_true", help="print one JSON object keyed by format name")
    d.add_argument("--mib", type=int, default=64, help="MiB of float32 output per format (default 64)")
    d.add_argument("--repeat", type=int, default=3, help="timed repetitions; the best is kept (default 3)")
    d.add_argument("--threads", type=int, default=None, help="threads for the all-threads figure (default: all)")
    d.add_argument("--types", nargs="+", type=_format_arg, default=None, metavar="TYPE", help="only these formats (e.g. q4_k q8_0)")
    d.set_defaults(func=_run_dequant)
    _add_cache_parser(sub)
    _add_pager_parser(sub)
    _add_tiered_parser(sub)
