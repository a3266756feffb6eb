"""`strata bench MODEL|ladder|dequant|cache|pager|tiered`: parse the arguments, call `strata.bench`, print
its figures as a table (or one JSON object with --json). The tables are formatted here and only
here; `benchmarks/` imports the formatters to print the same tables.

Must not measure anything itself: every figure comes from `strata.bench`.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from strata.defaults import DEFAULT_PREFETCH_DEPTH
from strata.errors import StrataError
from strata.defaults import DEFAULT_PAGER_THREADS, DEFAULT_PREFETCH_MARGIN, REPLAY_PREFETCH_MARGIN
from strata.units import format_bytes

from .common import add_hf_arg, resolve_model
from .tiers import column, fast_tier, format_prediction_depths


def format_dequant(results: dict[str, dict[str, float]]) -> str:
    """The table `strata bench dequant` prints: GB/s per format and kernel."""
    cols = [c for c in next(iter(results.values())) if c != "avx2_kernel"]
    lines = [f"GB/s of float32 output ({'  '.join(cols)})", f"{'format':<8}" + "".join(f"{c:>18}" for c in cols)]
    for name, row in results.items():
        mark = "" if row.get("avx2_kernel", 1.0) else "  (no AVX2 kernel: scalar)"
        lines.append(f"{name:<8}" + "".join(f"{row[c]:>18.2f}" for c in cols) + mark)
    return "\n".join(lines)


def format_cache(result: dict) -> str:
    """The table `strata bench cache` prints."""
    recall = ", ".join(f"{r:.3f} at +{i + 1}" for i, r in enumerate(result["predictor_recall"]))
    widths = [13, 8, 13, 7, 8, 10, 8, 7, 10, 11, 7]
    cells = [["", "hit rate", "", "", "", "", "loads per request", "", "", "prefetches", ""],
             ["slots/layer", "policy", "no prefetch", "LRU", "fixed*", "Belady*", "policy", "LRU", "Belady*",
              "precision", "recall"]]
    for n, row in result["slots"].items():
        hits = [row[c]["hit_rate"] for c in ("policy", "policy_no_prefetch", "lru", "fixed", "belady")]
        loads = [row[c]["loads_per_request"] for c in ("policy", "lru", "belady")]
        prefetch = [row["policy"].get(c, 0.0) for c in ("prefetch_precision", "prefetch_recall")]
        cells.append([f"{n} of {result['n_experts']}"] + [f"{x:.3f}" for x in hits + loads + prefetch])
    table = ["".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells]
    return "\n".join([
        f"trace {result['trace']}: {result['layers']} layers x {result['tokens']} tokens, "
        f"top-{result['top_k']} of {result['n_experts']} experts; cold start included",
        f"policy: use-count half-life {result['half_life_steps']:g} steps, prefetch depth "
        f"{result['prefetch_depth']}, margin {result['prefetch_margin']:g}",
        f"co-occurrence predictor, online top-{result['top_k']} recall (= precision): {recall}",
        "predictors by depth (online; p > x: the predictions that pay for their read):",
        *format_prediction_depths(result.get("predictor_scores", {})),
        "", *table, "",
        "* oracles: the fixed hot set knows the whole trace's counts (preloaded, no loads); Belady knows the",
        "  future and is the ceiling of caches that load only on a miss (prefetching can pass its hit rate,",
        "  never its loads).",
    ])


def format_pager(r: dict[str, Any]) -> str:
    """The report `strata bench pager` prints."""
    from strata.bench.pager import SEQ_BLOCK

    lines = [
        f"{r['file']}: {format_bytes(r['file_bytes'])}, {r['n_slabs']} expert slabs of "
        f"{r['slab_bytes_mean'] / 2**20:.2f} MiB on average",
        f"sequential O_DIRECT (1 thread, {SEQ_BLOCK >> 20} MiB reads), best: {r['sequential_direct_gbs']:.3f} GB/s",
        f"pager, slabs in random order ({r['n_threads']} threads, depth {r['depth']}, chunks of "
        f"{r['chunk_bytes'] >> 10} KiB, align {r['align']}), best: {r['pager_slabs_gbs']:.3f} GB/s",
        f"ratio pager / sequential: {r['ratio']:.2f} (median of {r['repeat']} back-to-back pairs; "
        f"of the best figures: {r['ratio_of_bests']:.2f}); bytes read / requested "
        f"{r['pager_bytes_read_over_requested']:.4f}",
        "runs (GB/s): sequential " + " ".join(f"{x:.3f}" for x in r["runs"]["sequential_direct_gbs"])
        + ", pager " + " ".join(f"{x:.3f}" for x in r["runs"]["pager_slabs_gbs"]),
    ]
    if "host_tier" in r:
        h = r["host_tier"]
        lines.append(f"host tier, experts in random order ({h['slots_per_layer']} slots per layer, "
                     f"{h['evictions']} evictions): {h['gbs']:.3f} GB/s, {r['host_tier_ratio']:.2f} of the "
                     f"best sequential")
    return "\n".join(lines)


def format_tiered(r: dict[str, Any]) -> str:
    """The table `strata bench tiered` prints: one row per prefetch depth."""
    first, fast = next(iter(r["by_depth"].values())), fast_tier(r["device"])
    lines = [f"{r['file']}: {r['tokens']} tokens per run, {r['repeat']} run(s) per depth, {r['form']} slots, "
             f"{first['device_slots_per_layer']} {fast} / {first['host_slots_per_layer']} host slots per layer; "
             f"same tokens at every depth: {r['same_tokens']}",
             f"depth  tok/s  {column(r['device'])}  late  miss  host.hit  disk  wait_s  dequant_s  precision  recall  "
             "pf.issued  pf.used"]
    for d, x in r["by_depth"].items():
        pct = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
        lines.append(f"{d:>5}  {x['decode_tok_s']:>5.2f}  {pct(x['device_hit_rate']):>7}  {x['device_late']:>4.0f}  "
                     f"{x['device_misses']:>4.0f}  {x['host_hits']:>8.0f}  {x['disk_reads']:>4.0f}  "
                     f"{x['wait_s']:>6.3f}  {x['dequant_s']:>9.3f}  {pct(x['precision']):>9}  {pct(x['recall']):>6}  "
                     f"{x['prefetch_issued']:>9.0f}  {x['prefetch_used']:>7.0f}")
    for d, ratio in r.get("wait_ratio", {}).items():
        lines.append(f"wait with prefetch depth {d} / without: "
                     + ("-" if ratio is None else f"{ratio:.2f}"))
    return "\n".join(lines)


def _format_warmup(r: dict[str, Any]) -> str:
    """The warm-up's line: its figures apart from the timed repetitions' (cold: experts paged in)."""
    w = r.get("warmup")
    if w is None:
        return "no warm-up (--no-warmup): the first repetition of each test is cold, averaged in"
    reads = "" if w["expert_reads"] is None else f", {w['expert_reads']} expert reads"
    return (f"warm-up, untimed and not averaged: pp{r['prompt']} {w['pp_tok_s']:.2f} tok/s, decode step "
            f"x{w['batch']} {w['tg_tok_s']:.2f} tok/s{reads}")


def format_model(r: dict[str, Any]) -> str:
    """The report `strata bench MODEL` prints: llama-bench's table, then where the time goes."""
    def rate(x: dict[str, float]) -> str:
        return f"{x['mean']:9.2f} +- {x['std']:6.2f}"

    lines = [f"{r['file']}: {r['memory']}; {r['compute']} compute on {r['device']}, threads {r['threads'] or 'all'}; "
             f"{r['reps']} repetitions; loaded in {r['load_s']:.1f} s", _format_warmup(r),
             f"{'test':<14}{'tok/s':>21}", f"{'pp' + str(r['prompt']):<14}{rate(r['pp_tok_s']):>21}"]
    for b, x in r["tg"].items():
        lines.append(f"{'tg' + str(r['gen']) + (f' x{b}' if int(b) > 1 else ''):<14}{rate(x['tok_s']):>21}")
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    for b, x in r["tg"].items():
        s, roof = x["split_ms"], x["roofline"]
        lines += ["", f"decode, batch {b} (last run, {x['tokens_per_run']} tokens):",
                  "  ms per token: " + ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in s.items())
                  + f"; waiting for experts {pct(x['wait_share'])} of the time"]
        t = x.get("tiers")
        if t:
            fast = fast_tier(r["device"])
            lines.append(f"  {fast} hit rate {pct(t['device_hit_rate'])}, host hit rate (of {fast} misses) "
                         f"{pct(t['host_hit_rate'])}; per token: {format_bytes(t['disk_bytes_per_token'])} from "
                         f"disk, {format_bytes(t['device_bytes_per_token'])} into {fast} slots")
            if t.get("belady_disk_bytes_per_token") is not None:
                opt = t["belady_disk_bytes_per_token"]
                times = f" ({t['disk_bytes_per_token'] / opt:.2f}x)" if opt else ""
                lines.append(f"  Belady's optimal for the same routing and host slots: {format_bytes(opt)} per "
                             f"token from disk{times}")
            lines += format_prediction_depths(t.get("prediction_depths", {}), "  predictor ")
        bound = lambda v: "-" if v is None else f"{v:.2f} tok/s"  # noqa: E731
        lines.append(f"  roofline: compute-bound {bound(roof['compute_bound_tok_s'])}, transfer-bound "
                     f"{bound(roof.get('transfer_bound_tok_s'))}; measured {x['tok_s']['mean']:.2f} tok/s = "
                     f"{pct(roof['share_of_bound'])} of the bound")
    disk = "-" if r["disk_gbs"] is None else f"{r['disk_gbs']:.2f} GB/s"
    h2d = "" if r["h2d_gbs"] is None else f", host to device {r['h2d_gbs']:.2f} GB/s"
    lines += ["", f"disk (sequential O_DIRECT on this file) {disk}{h2d}; peak RSS {format_bytes(r['peak_rss_bytes'])}"
              + (f", peak device memory {format_bytes(r['peak_device_bytes'])}" if "peak_device_bytes" in r else "")]
    return "\n".join(lines)


def format_ladder(r: dict[str, Any]) -> str:
    """The table `strata bench ladder` prints: one row per mechanism added."""
    from strata.bench.ladder import MEASURES

    lines = [f"{r['file']}: ablation ladder on {r['device']}, {r['gen']} tokens per sequence, threads "
             f"{r['threads'] or 'all'}", f"{'step':<26}{'batch':>6}{'tok/s':>10}{'x naive':>9}  memory"]
    for x in r["rows"]:
        ratio = "-" if x["ratio"] is None else f"{x['ratio']:.2f}"
        lines.append(f"{x['name']:<26}{x['batch']:>6}{x['tok_s']:>10.2f}{ratio:>9}  {x['memory']}")
        if x["ratio"] is not None and x["ratio"] < 1 and x["name"] in MEASURES:
            lines.append(f"  (slower than naive: {MEASURES[x['name']]})")
    return "\n".join(lines)


def progress_bar(args: argparse.Namespace, total: int, desc: str):
    """A tqdm bar on stderr, or None with --json or when stderr is not a terminal (a log or a pipe
    gets the result alone)."""
    if getattr(args, "json", False) or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="run", file=sys.stderr, dynamic_ncols=True, leave=False)


def _on_step(bar):
    """A library progress callback `(done, total, label)` that advances `bar` (None: no bar)."""
    if bar is None:
        return None

    def step(done: int, total: int, label: str) -> None:
        bar.set_postfix_str(label, refresh=False)
        bar.update(done - bar.n)

    return step


def _with_bar(args: argparse.Namespace, total: int, desc: str, run):
    """`run(on_step)` with a progress bar of `total` steps while it runs."""
    bar = progress_bar(args, total, desc)
    try:
        return run(_on_step(bar))
    finally:
        if bar is not None:
            bar.close()


def _print(result: Any, args: argparse.Namespace, fmt) -> int:
    print(json.dumps(result, indent=2) if args.json else fmt(result))
    return 0


def _run_dequant(args: argparse.Namespace) -> int:
    from strata.bench.dequant import bench_dequant

    return _print(bench_dequant(out_mib=args.mib, repeat=args.repeat, threads=args.threads, types=args.types),
                  args, format_dequant)


def _format_arg(name: str):
    from strata.quant import DEQUANT_TYPES, ggml_type

    try:
        t = ggml_type(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if t not in DEQUANT_TYPES:
        raise argparse.ArgumentTypeError(f"{t.name} is not a format Strata dequantizes")
    return t


def format_cache_candidates(result: dict) -> str:
    """The table `strata bench cache --candidates` prints."""
    lines = [f"trace {result['trace']}: each candidate's hit rate / Belady's and loads / Belady's "
             "(* not online: knows the trace's counts; window-W: Belady seeing W steps ahead)"]
    for n, row in result["slots"].items():
        lines.append(f"{n} of {result['n_experts']} slots: Belady hit rate {row['belady_hit_rate']:.3f}, "
                     f"loads per request {row['belady_loads']:.3f}")
        lines += [f"  {name:<20} {r['hit_over_belady']:.2f}  {r['loads_over_belady']:.2f}x"
                  for name, r in row.items() if isinstance(r, dict)]
    return "\n".join(lines)


def _run_cache(args: argparse.Namespace) -> int:
    from strata.bench.cache import bench_cache

    if args.candidates:
        from strata.bench.cache_candidates import bench_candidates

        return _print(bench_candidates(args.trace, args.slots), args, format_cache_candidates)
    return _print(bench_cache(args.trace, args.slots, args.prefetch_depth, args.prefetch_margin), args, format_cache)


def _add_cache_parser(sub) -> None:
    c = sub.add_parser("cache", help="replay a routing trace through the expert placement policy, "
                                     "beside LRU, the best fixed hot set and Belady's optimal")
    c.add_argument("--trace", required=True, help="routing trace (.npz with indices [layers, tokens, k])")
    c.add_argument("--slots", type=int, nargs="+", default=[8, 16, 32], help="expert slots per layer (default 8 16 32)")
    c.add_argument("--prefetch-depth", type=int, default=1, help="layers ahead to predict and prefetch; 0: off (default %(default)s)")
    c.add_argument("--prefetch-margin", type=float, default=None,
                   help="a prefetch of probability p displaces only experts worth less than p/margin "
                        f"(default {REPLAY_PREFETCH_MARGIN:g}, the replay's; decoding uses {DEFAULT_PREFETCH_MARGIN:g})")
    c.add_argument("--candidates", action="store_true",
                   help="measure the eviction, budget and prefetch candidates against Belady instead")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=_run_cache)


def _run_pager(args: argparse.Namespace) -> int:
    from strata.bench.pager import bench_pager

    resolve_model(args, "file")
    result = bench_pager(args.file, n_threads=args.threads, depth=args.depth, chunk_bytes=args.chunk_kib * 1024,
                         repeat=args.repeat, host=not args.no_host)
    return _print(result, args, format_pager)


def _add_pager_parser(sub) -> None:
    p = sub.add_parser("pager", help="GB/s of the pager reading a GGUF's expert slabs in random order, "
                                     "beside the disk's sequential O_DIRECT rate on the same file")
    p.add_argument("file", nargs="?", default=None,
                   help="GGUF model file (benchmarks/pager_read.py writes a synthetic one), or -hf")
    add_hf_arg(p)
    p.add_argument("--threads", type=int, default=DEFAULT_PAGER_THREADS,
                   help=f"pager worker threads (default {DEFAULT_PAGER_THREADS})")
    p.add_argument("--depth", type=int, default=16, help="slabs in flight (default %(default)s)")
    p.add_argument("--chunk-kib", type=int, default=0, help="largest single read in KiB (default: the pager's, 1024)")
    p.add_argument("--repeat", type=int, default=3, help="alternating sequential/pager pass pairs (default %(default)s)")
    p.add_argument("--no-host", action="store_true", help="skip the host-tier figure")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run_pager)


def _run_tiered(args: argparse.Namespace) -> int:
    from strata.bench.tiered import bench_tiered

    resolve_model(args)
    result = _with_bar(args, len(args.depths) * args.repeat, "tiered", lambda on_step: bench_tiered(
        args.model, depths=args.depths, tokens=args.tokens, repeat=args.repeat, temperature=args.temperature,
        seed=args.seed, device=args.device, dtype=args.dtype, threads=args.threads, n_ctx=args.ctx,
        device_mem=args.device_mem, host_mem=args.host_mem, slot_form=args.slot_form, on_run=on_step))
    return _print(result, args, format_tiered)


def _add_run_args(p: argparse.ArgumentParser, ctx: int | None, ctx_help: str, budgets_of: str) -> None:
    """The model, device, threads, context and budget options of `bench tiered` and `bench ladder`."""
    p.add_argument("model", nargs="?", default=None, help="GGUF model file, or -hf")
    add_hf_arg(p)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--dtype", default=None, help="compute dtype (default float32 on cpu, bfloat16 on cuda)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all available)")
    p.add_argument("--ctx", type=int, default=ctx, help=ctx_help)
    p.add_argument("--device-mem", default=None, metavar="SIZE", help=f"device budget{budgets_of}, e.g. 2G (default: the machine's)")
    p.add_argument("--host-mem", default=None, metavar="SIZE", help=f"host budget{budgets_of}, e.g. 8G (default: the machine's)")


def _add_tiered_parser(sub) -> None:
    t = sub.add_parser("tiered", help="decode through the tiered expert memory with prefetch off and on: hits, "
                                      "bytes moved, time waited for experts, prefetch precision and recall")
    _add_run_args(t, ctx=256, ctx_help="context length (default 256)", budgets_of="")
    t.add_argument("--slot-form", choices=("dequantized", "packed"), default=None, help="device slot form")
    t.add_argument("--depths", type=int, nargs="+", default=[0, 2], help="prefetch depths to compare (default 0 2)")
    t.add_argument("--tokens", type=int, default=64, help="tokens decoded per run (default %(default)s)")
    t.add_argument("--repeat", type=int, default=1, help="runs per depth, alternating (default %(default)s)")
    t.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1: varied text)")
    t.add_argument("--seed", type=int, default=0, help="prompt and sampling seed")
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.set_defaults(func=_run_tiered)


def _run_model(args: argparse.Namespace) -> int:
    from strata.bench.model import bench_model, bench_steps

    from .common import check_model_args, expert_parallel, follow_rank, load_kwargs

    check_model_args(args)
    for flag, value in (("-p", args.p), ("-n", args.n), ("--reps", args.reps)):
        if value < 1:
            raise StrataError(f"strata bench {flag} {value}: expected a positive number of "
                              f"{'repetitions' if flag == '--reps' else 'tokens'}")
    batches = _int_list(args.batch, "--batch")
    ep = expert_parallel(args)  # rank 0 runs the bench, the other ranks follow its forward passes
    kwargs = dict(load_kwargs(args), **({} if ep is None else {"expert_parallel": ep}))
    try:
        if ep is not None and ep.rank != 0:
            import strata
            from strata.bench.model import bench_load_kwargs

            return follow_rank(ep, lambda: strata.load(args.model, **bench_load_kwargs(args.p, args.n, batches, kwargs)))
        total = bench_steps(args.reps, batches, not args.no_warmup)
        result = _with_bar(args, total, "bench", lambda on_step: bench_model(
            args.model, prompt=args.p, gen=args.n, batches=batches, reps=args.reps, seed=args.seed,
            warmup=not args.no_warmup, on_step=on_step, **kwargs))
        return _print(result, args, format_model)
    finally:
        if ep is not None:
            ep.close()


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise StrataError(f"{flag} {text!r}: expected positive integers separated by commas, e.g. 1,8")
    return values


def _add_model_parser(sub) -> None:
    from .common import add_expert_parallel_args, add_model_args

    m = sub.add_parser("model", help="prompt processing and decode speed of a whole model, with the time split, "
                                     "tier hit rates and the roofline (also: strata bench MODEL.gguf)")
    add_model_args(m)
    m.add_argument("-p", type=int, default=512, metavar="N", help="prompt tokens of the pp test (default %(default)s)")
    m.add_argument("-n", type=int, default=128, metavar="N", help="tokens generated per sequence in tg (default %(default)s)")
    m.add_argument("--batch", default="1", help="sequences decoded together in tg, comma-separated (default 1)")
    m.add_argument("--reps", type=int, default=3, help="repetitions of each test (default %(default)s)")
    m.add_argument("--no-warmup", action="store_true",
                   help="skip the untimed warm-up (the whole prompt and one decode step, as llama-bench's) that "
                        "runs before the timed repetitions; without it the first repetition pages the experts in")
    m.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    m.add_argument("--json", action="store_true", help="print one JSON object")
    add_expert_parallel_args(m)
    m.set_defaults(func=_run_model)


def _run_ladder(args: argparse.Namespace) -> int:
    from strata.bench.ladder import bench_ladder

    from strata.bench.ladder import ROWS

    resolve_model(args)
    result = _with_bar(args, len(ROWS), "ladder", lambda on_step: bench_ladder(
        args.model, gen=args.n, batch=args.batch, device=args.device, dtype=args.dtype, threads=args.threads,
        n_ctx=args.ctx, device_mem=args.device_mem, host_mem=args.host_mem, prefetch_depth=args.prefetch_depth,
        seed=args.seed, on_row=on_step))
    return _print(result, args, format_ladder)


def _add_ladder_parser(sub) -> None:
    a = sub.add_parser("ladder", help="the ablation ladder: naive, + batching, + prefetch, + placement and caching, "
                                      "+ packed compute; tokens/s of each and its ratio to naive")
    _add_run_args(a, ctx=None, ctx_help="context length (default: -n plus a little)", budgets_of=" of the caching rows")
    a.add_argument("--prefetch-depth", type=int, default=None, metavar="D",
                   help=f"prefetch depth of the tiered rows (default {max(1, DEFAULT_PREFETCH_DEPTH['cpu'])} on cpu, "
                        f"{DEFAULT_PREFETCH_DEPTH['cuda']} on cuda: at least 1, the rows measure prefetch)")
    a.add_argument("-n", type=int, default=32, metavar="N", help="tokens decoded per sequence (default %(default)s)")
    a.add_argument("--batch", type=int, default=8, help="sequences decoded together from the batching row on "
                                                        "(default %(default)s)")
    a.add_argument("--seed", type=int, default=0, help="seed of the one-token prompts")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.set_defaults(func=_run_ladder)


#: The subcommands of `strata bench`; anything else in their place is a model file.
SUBCOMMANDS = ("dequant", "cache", "pager", "tiered", "model", "ladder")


def normalize_argv(argv: list[str]) -> list[str]:
    """`strata bench MODEL.gguf ...` (or `strata bench -hf USER/REPO ...`) is `strata bench model ...`."""
    if len(argv) >= 2 and argv[0] == "bench" and argv[1] not in SUBCOMMANDS and \
            (not argv[1].startswith("-") or argv[1] in ("-hf", "--hf-repo") or argv[1].startswith("--hf-repo=")):
        return [argv[0], "model", *argv[1:]]
    return argv


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="measure speed and hit rates (a whole model, dequantization, expert "
                                            "cache, ...): strata bench MODEL.gguf, or strata bench SUBCOMMAND")
    sub = p.add_subparsers(dest="bench_command", required=True)
    d = sub.add_parser("dequant", help="GB/s of every dequantization kernel against gguf.quants and memcpy")
    d.add_argument("--json", action="store_true", help="print one JSON object keyed by format name")
    d.add_argument("--mib", type=int, default=64, help="MiB of float32 output per format (default %(default)s)")
    d.add_argument("--repeat", type=int, default=3, help="timed repetitions; the best is kept (default %(default)s)")
    d.add_argument("--threads", type=int, default=None, help="threads for the all-threads figure (default: all)")
    d.add_argument("--types", nargs="+", type=_format_arg, default=None, metavar="TYPE", help="only these formats (e.g. q4_k q8_0)")
    d.set_defaults(func=_run_dequant)
    _add_cache_parser(sub)
    _add_pager_parser(sub)
    _add_tiered_parser(sub)
    _add_model_parser(sub)
    _add_ladder_parser(sub)
