"""Benchmark: Strata beside llama.cpp on the same synthetic GGUF files, same threads, one run.

    python benchmarks/packed_vs_llama.py [--shapes medium,mixtral] [--threads 2] [-n 32] [--reps 3] [--rounds 1]
        [--prompt 64] [--strata-args '{"compute": "packed"}'] [--workdir /tmp/strata-bench] [--json]
    python benchmarks/packed_vs_llama.py --out-of-ram [--shape large] [--ratio 2.6] [-n 16] [--warmup 4]
        [--compute-bound] [--with-llama [--llama-cap-s 240]]
    python benchmarks/packed_vs_llama.py --small [--out-of-ram]      # smoke run on tiny files
    python benchmarks/packed_vs_llama.py --shapes iquants            # medium requantized: i-quants, Q2_K

In RAM (issue 9, figure 1): for each shape (benchmarks/synthetic_moe.py SHAPES; files cached in
--workdir), llama.cpp (llama-cpp-python, the build the tests use) and then Strata, each in its own
child process with the same thread count, measure
  prefill: a 64-token prompt evaluated at once (llama.cpp `eval`; Strata `generate(max_tokens=1)`,
           whose prefill time ends with the first token), `reps` times;
  decode:  `n` tokens one at a time after an 8-token prompt (llama.cpp: `eval` of one token, the
           next token the argmax; Strata: greedy `generate`), `reps` times;
after one untimed warm-up of each. Prints tok/s as mean +- standard deviation (min-max) and the
ratios Strata / llama.cpp of the means. The children run one after the other, so load from other
processes and a machine whose speed drifts can favour either: `--rounds N` runs N pairs of
children per shape, alternating which engine goes first, and gives the median of the pairs'
ratios (and each pair's). Compare only figures from one run, and run on a
quiet machine: llama.cpp's OpenMP threads spin while they wait, so on oversubscribed cores its
figures collapse (medium decoded at 2 tok/s, not 64-83, with a load average of 7 on 2 cores).
Each shape's report also says which ISA each engine ran: llama.cpp's `llama_print_system_info()`
features (with "(AMX denied)" on AMX CPUs, where its AMX kernel crashes in this build and the child
runs it as on a CPU without AMX, repacked rows kept: benchmarks/llama_amx.py), Strata's default kernel family and, per ggml type in the file (with its share of the
file's tensor bytes), the family of the packed kernel its table hands out (native.type_support:
for prefill, and for decode where the table picks another).

Requantized files: a shape `BASE@FTYPE` (e.g. `medium@IQ2_XS`) is BASE's file requantized by
llama.cpp's own quantizer (`llama_cpp.llama_model_quantize`, the code `llama-quantize` runs,
`--allow-requantize`) to llama.cpp file type FTYPE (LLAMA_FTYPE_MOSTLY_FTYPE: its own per-tensor
type mix), cached beside BASE's file. Every weight matrix gets an importance matrix of ones
(`llama_model_imatrix_data` entries, as `--imatrix` hands them over): llama.cpp refuses IQ1/IQ2
types without one, and on random weights a calibrated one weighs nothing better (the kernels'
speed does not depend on the values). `--shapes iquants` is medium as IQ4_XS, IQ3_S, IQ2_XS and
Q2_K (issue 23); `--small --shapes iquants` the tiny shape as the same four.

Out of RAM (figure 2): a cold copy of the file (`dd iflag=direct oflag=direct`, so no page of it
is cached) decoded by Strata inside a v1 memory cgroup `ratio` times smaller than the file
(benchmarks/tiered_cgroup.py's cgroup), budgets inside the limit unless --strata-args sets them.
The O_DIRECT sequential read rate of that copy is measured before and after the decode (the mean
is the reference), and so is the rate of a fresh pager reading the copy's expert slabs in random
order, 16 in flight (strata.bench.pager.random_slab_rate: the pattern of expert misses; a disk
that serves several readers faster than one sequential reader can beat the first rate). Reports
decode tok/s after `warmup` tokens, expert bytes read from disk per token
(`Model.memory_stats()`), the disk-bound rate = read rate / bytes per token at each of the two
rates, Strata's share of each, and the per-token split of every timer the stats report (wait_s,
dequant_s, ...). `--shape large` routes near-uniformly (Gaussian routers), and its greedy decode
reads few experts per token; `--shape large-routed` routes like a real model (synthetic_moe.py).
--compute-bound also decodes the original file outside the cgroup with every expert in RAM (`memory
"direct"`, the page cache warm), the rate compute alone allows, and reports Strata's share of the
lower of the two bounds (the disk's: the higher of its two rates): where the tiers keep most
experts in memory, few bytes are read per token and the disk-bound rate exceeds what the CPU can
compute.
--with-llama then runs llama.cpp in a cgroup of the same limit on a fresh cold copy (its mmap
pages count against the limit as Strata's do; weight repacking off, as llama-bench's `--repack 0`,
since its anonymous repacked copy of the weights cannot fit): `warmup` tokens, then up to `n` timed, stopping
early after --llama-cap-s seconds.
--strata-args is passed to `strata.load` last (it may override device, threads, n_ctx, the
budgets). --small: the tiny and tiny-mixtral shapes in RAM, 8 tokens x 2; out of RAM the "small"
shape (0.24 GB) under a cgroup floored at 1 GiB (Python alone needs more than 0.24 / 2.6 GB)
with 128M/48M budgets, so the tiers still read experts from the disk though the file would fit.
Not a test: it asserts nothing. Default runs take a few minutes on 2 cores (file writing
included the first time).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.llama_amx import deny_amx, open_without_extra_buffers  # noqa: E402
from benchmarks.bench_files import cold_copy, file_types, prompt_ids, shape_file  # noqa: E402
from benchmarks.packed_vs_llama_report import format_in_ram, format_out_of_ram  # noqa: E402
from benchmarks.synthetic_moe import SHAPES  # noqa: E402

DECODE_PROMPT = 8  # tokens before a decode run
CHILD_TIMEOUT = 1200.0
#: llama.cpp file types of the `iquants` shapes (issue 23: what i-quant MoE files are published in).
IQUANT_FTYPES = ("IQ4_XS", "IQ3_S", "IQ2_XS", "Q2_K")


# -- children: one engine each -----------------------------------------------------------------

def spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "runs": values}


def child_llama(a: argparse.Namespace) -> dict:
    amx_denied = deny_amx()  # before llama.cpp starts: its AMX kernel crashes in this build (llama_amx.py)
    import numpy as np
    from llama_cpp import Llama

    if a.out_of_ram:  # no repacking into anonymous copies: in a memory limit they are killed (FACTS.md)
        open_without_extra_buffers()
    t0 = time.perf_counter()
    llm = Llama(model_path=str(a.file), n_threads=a.threads, n_threads_batch=a.threads, n_ctx=a.n_ctx,
                n_batch=max(a.prompt, DECODE_PROMPT), logits_all=False, verbose=False)
    load_s = time.perf_counter() - t0
    n_vocab = llm.n_vocab()
    prompt = prompt_ids(a.prompt)

    def argmax() -> int:  # greedy, from the last position's logits (the only ones kept)
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))

    def prefill() -> float:
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt)
        return len(prompt) / (time.perf_counter() - t)

    def decode(n: int) -> float:
        llm.reset()
        llm.eval(prompt[:DECODE_PROMPT])
        token, t = argmax(), time.perf_counter()
        for _ in range(n):
            llm.eval([token])
            token = argmax()
        return n / (time.perf_counter() - t)

    if a.out_of_ram:  # one decode, as Strata's: warm-up tokens, then n timed, stopped at a time cap
        llm.eval(prompt[:DECODE_PROMPT])
        token = argmax()
        for _ in range(a.warmup):
            llm.eval([token])
            token = argmax()
        t, n = time.perf_counter(), 0
        while n < a.n and time.perf_counter() - t < a.llama_cap_s:
            llm.eval([token])
            token, n = argmax(), n + 1
        seconds = time.perf_counter() - t
        return {"engine": "llama.cpp", "load_s": load_s, "decode": {"tok_s": n / seconds, "tokens": n,
                                                                    "seconds": seconds},
                "self_peak_rss_kib": _peak_rss_kib()}
    prefill(), decode(a.n)  # warm-up: page the file in (mapped pages), start the thread pool
    return {"engine": "llama.cpp", "load_s": load_s, "isa": llama_isa() + (" (AMX denied)" if amx_denied else ""),
            "prefill_tok_s": spread([prefill() for _ in range(a.reps)]),
            "decode_tok_s": spread([decode(a.n) for _ in range(a.reps)])}


def llama_isa() -> str:
    """llama.cpp's CPU features as its system info string gives them ('AVX2 FMA ...'), those it
    reports as 1 (the ISA its ggml was built for and runs)."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    return " ".join(k.rpartition(":")[2].strip() for k, _, v in (f.partition("=") for f in info.split("|"))
                    if v.strip() == "1")


def strata_isa(path: Path) -> dict:
    """Strata's default kernel family and, per ggml type of the file, the family of its packed kernel."""
    from strata import native

    return {"default": native.default_impl(), "avx_vnni": native.cpu_avx_vnni(),
            "types": {name: {"share": share, "runs": native.type_support(name).runs,
                             "decode_runs": native.type_support(name).decode_runs}
                      for name, share in file_types(path).items()}}


def strata_decode(model, n: int, warmup: int) -> dict:
    """Greedy decode of `warmup` + `n` tokens after an 8-token prompt; tok/s and the memory
    statistics over the last `n` (reset when the warm-up tokens are out)."""
    stream = model.generate(prompt_ids(DECODE_PROMPT), max_tokens=1 + warmup + n, temperature=0, stream=True,
                            stop_token_ids=())
    t0, seen = None, 0
    for _ in stream:
        seen += 1
        if seen == 1 + warmup:  # the prompt's token and the warm-up tokens are out
            stats = model.memory_stats()
            if stats is not None:
                stats.reset()
            t0 = time.perf_counter()
    seconds = time.perf_counter() - t0
    stats = model.memory_stats()
    return {"tok_s": (seen - 1 - warmup) / seconds, "tokens": seen - 1 - warmup, "seconds": seconds,
            "stats": stats.totals() if stats is not None else None}


def child_strata(a: argparse.Namespace) -> dict:
    import strata

    t0 = time.perf_counter()
    # no prefix cache: each prefill rep computes its whole prompt, as llama-bench's do
    kwargs = {"device": "cpu", "threads": a.threads, "n_ctx": a.n_ctx, "max_batch": 1, "prefix_cache": False,
              **json.loads(a.strata_args)}
    model = strata.load(a.file, **kwargs)
    load_s = time.perf_counter() - t0
    prompt = prompt_ids(a.prompt)

    def prefill() -> float:
        c = model.generate(prompt, max_tokens=1, temperature=0, stop_token_ids=())
        return len(prompt) / c.prefill_seconds

    if a.out_of_ram:  # one long decode: its first tokens fill the cold tiers
        run = strata_decode(model, a.n, a.warmup)
        return {"engine": "strata", "load_s": load_s, "decode": run, "memory": repr(model.memory),
                "self_peak_rss_kib": _peak_rss_kib()}
    prefill(), strata_decode(model, a.n, 0)  # warm-up: as long as a measured run (first touches of mapped pages)
    runs = [strata_decode(model, a.n, 0) for _ in range(a.reps)]
    return {"engine": "strata", "load_s": load_s, "memory": repr(model.memory), "isa": strata_isa(a.file),
            "prefill_tok_s": spread([prefill() for _ in range(a.reps)]),
            "decode_tok_s": spread([r["tok_s"] for r in runs]), "decode_stats": runs[-1]["stats"]}


def _peak_rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


def run_child(engine: str, path: Path, a: argparse.Namespace, group: Path | None = None) -> dict:
    """Run one engine's measurements in a child process (inside memory cgroup `group` if given)."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", engine, "--file", str(path),
            "--threads", str(a.threads), "-n", str(a.n), "--reps", str(a.reps), "--prompt", str(a.prompt),
            "--warmup", str(a.warmup), "--n-ctx", str(a.n_ctx), "--strata-args", a.strata_args]
    argv += ["--out-of-ram", "--llama-cap-s", str(a.llama_cap_s)] if a.out_of_ram else []
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    preexec = (lambda: (group / "cgroup.procs").write_text(str(os.getpid()))) if group else None
    if group is not None:
        (group / "memory.max_usage_in_bytes").write_text("0")
        failcnt0 = int((group / "memory.failcnt").read_text())
    t0 = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, preexec_fn=preexec,
                              timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"engine": engine, "error": f"timed out after {CHILD_TIMEOUT:.0f} s"}
    result = {"wall_s": time.perf_counter() - t0, "returncode": done.returncode}
    if group is not None:
        result["cgroup_peak_bytes"] = int((group / "memory.max_usage_in_bytes").read_text())
        result["cgroup_failcnt"] = int((group / "memory.failcnt").read_text()) - failcnt0
    if done.returncode != 0:
        return {"engine": engine, **result, "error": done.stderr.strip().splitlines()[-3:] or "killed"}
    return {**result, **json.loads(done.stdout.strip().splitlines()[-1])}


# -- the two figures ---------------------------------------------------------------------------

def merged(children: list[dict]) -> dict:
    """One engine's children of several rounds as one result: the first child's fields, every
    child's runs pooled (a failed child's error if any failed)."""
    failed = [c for c in children if "error" in c]
    if failed:
        return failed[0]
    out = dict(children[0])
    for what in ("prefill_tok_s", "decode_tok_s"):
        if all(what in c for c in children):
            out[what] = spread([v for c in children for v in c[what]["runs"]])
    return out


def in_ram(a: argparse.Namespace) -> dict:
    """Per shape, `a.rounds` rounds of one llama.cpp child and one Strata child (llama.cpp first in
    even rounds, Strata first in odd ones). A shared machine's speed drifts over minutes, so each
    ratio is the median over rounds of that round's Strata / llama.cpp means (two children run
    back to back), not a ratio of means pooled over the whole run."""
    shapes = []
    for shape in a.shapes.split(","):
        path = shape_file(a.workdir, shape)
        rounds = []
        for r in range(a.rounds):
            order = ("llama", "strata") if r % 2 == 0 else ("strata", "llama")
            rounds.append({engine: run_child(engine, path, a) for engine in order})
        row = {"shape": shape, "spec": SHAPES[shape.partition("@")[0]], "file": str(path),
               "file_bytes": path.stat().st_size, "llama": merged([rd["llama"] for rd in rounds]),
               "strata": merged([rd["strata"] for rd in rounds])}
        for what in ("decode_tok_s", "prefill_tok_s"):
            per_round = [rd["strata"][what]["mean"] / rd["llama"][what]["mean"] for rd in rounds
                         if what in rd["llama"] and what in rd["strata"]]
            if len(per_round) == len(rounds):
                row[f"{what.split('_')[0]}_ratio"] = statistics.median(per_round)
                row[f"{what.split('_')[0]}_ratio_rounds"] = per_round
        shapes.append(row)
    return {"mode": "in-ram", "threads": a.threads, "n": a.n, "reps": a.reps, "rounds": a.rounds,
            "prompt": a.prompt, "strata_args": json.loads(a.strata_args), "shapes": shapes}


def out_of_ram(a: argparse.Namespace) -> dict:
    from benchmarks.tiered_cgroup import CGROUP_V1, _cgroup
    from strata.bench.pager import random_slab_rate, sequential_direct_rate

    if not os.access(CGROUP_V1, os.W_OK):
        raise SystemExit(f"{CGROUP_V1} is not writable (needs root and cgroup v1)")
    src = shape_file(a.workdir, a.shape)
    size = src.stat().st_size
    limit = max(int(size / a.ratio), a.min_limit_mib << 20)
    args = json.loads(a.strata_args)
    if "memory" not in args and not set(args) & {"device_mem", "prefetch_depth", "slot_form", "hybrid"}:
        args["memory"] = "paged"  # strata.load's CPU default for packed compute, named so the report says it
    paged = args.get("memory") == "paged"  # one RAM tier: its budget is host_mem
    for key, share in ((("host_mem", 0.6),) if paged else (("device_mem", 0.45), ("host_mem", 0.15))):
        small = a.small_budgets["paged" if paged else key]
        args.setdefault(key, small if a.small else int(share * size / a.ratio))  # inside the limit
    if not a.small and not paged and "host_mem" not in json.loads(a.strata_args):  # the host tier's floor
        from strata.gguf import open_model
        from strata.memory.budget import host_budget_for_slots
        mf = open_model(src)
        args["host_mem"] = max(args["host_mem"], host_budget_for_slots(mf, mf.hparams.n_experts_used))
    a.strata_args = json.dumps(args)
    cold = a.workdir / f"cold-{os.getpid()}-{src.name}"
    report = {"mode": "out-of-ram", "shape": a.shape, "spec": SHAPES[a.shape.partition("@")[0]], "file": str(src),
              "file_bytes": size,
              "limit_bytes": limit, "threads": a.threads, "strata_args": args}
    try:
        report["copy_s"] = cold_copy(src, cold)
        read_limit = int(a.read_gib * 2**30)
        before, _ = sequential_direct_rate(cold, limit=read_limit)
        slab_before = random_slab_rate(cold, read_limit // 2)
        group = _cgroup(limit)
        try:
            report["strata"] = run_child("strata", cold, a, group)
        finally:
            group.rmdir()
        after, _ = sequential_direct_rate(cold, limit=read_limit)
        slab_after = random_slab_rate(cold, read_limit // 2, seed=1)
        if a.compute_bound:  # the same decode with every expert in RAM: the compute-bound rate
            with open(src, "rb") as f:  # into the page cache first: the decode must not fault pages in
                while f.read(1 << 24):
                    pass
            in_ram_args = argparse.Namespace(**{**vars(a), "strata_args": json.dumps({"memory": "direct"})})
            report["in_ram"] = run_child("strata", src, in_ram_args)
        if a.with_llama:  # the same limit, a fresh cold copy (nothing of the file left in the page cache)
            cold.unlink()
            cold_copy(src, cold)
            group = _cgroup(limit)
            try:
                report["llama"] = run_child("llama", cold, a, group)
            finally:
                group.rmdir()
    finally:
        cold.unlink(missing_ok=True)
    report["read_bytes_per_s"] = {"before": before, "after": after, "mean": (before + after) / 2}
    report["slab_read_bytes_per_s"] = {"before": slab_before, "after": slab_after,
                                       "mean": (slab_before + slab_after) / 2}
    run = report["strata"].get("decode")
    if run and run.get("stats"):
        per_token = run["stats"]["bytes_disk"] / run["tokens"]
        report["disk_bytes_per_token"] = per_token
        if per_token > 0:
            report["disk_bound_tok_s"] = report["read_bytes_per_s"]["mean"] / per_token
            report["share_of_disk_bound"] = run["tok_s"] / report["disk_bound_tok_s"]
            report["slab_disk_bound_tok_s"] = report["slab_read_bytes_per_s"]["mean"] / per_token
            report["share_of_slab_disk_bound"] = run["tok_s"] / report["slab_disk_bound_tok_s"]
        ram = report.get("in_ram", {}).get("decode")
        if ram:  # against the higher of the two disk-bound rates: the stricter reference
            disk_bound = max(report.get("disk_bound_tok_s", float("inf")), report.get("slab_disk_bound_tok_s", 0.0))
            report["compute_bound_tok_s"] = ram["tok_s"]
            report["bound_tok_s"] = min(ram["tok_s"], disk_bound)
            report["share_of_bound"] = run["tok_s"] / report["bound_tok_s"]
        report["per_token_s"] = {k: v / run["tokens"] for k, v in run["stats"].items() if k.endswith("_s")}
        timed = sum(report["per_token_s"].values())
        report["per_token_s"]["total"] = run["seconds"] / run["tokens"]
        report["per_token_s"]["other"] = report["per_token_s"]["total"] - timed  # not covered by a timer
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=None, help="in RAM: comma-separated SHAPES or BASE@FTYPE (default "
                   "medium,mixtral; 'iquants': medium@IQ4_XS,medium@IQ3_S,medium@IQ2_XS,medium@Q2_K)")
    p.add_argument("--shape", default=None, help="out of RAM: the shape (default large)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("-n", type=int, default=None, help="decode tokens per run (default 32; out of RAM 16)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1,
                   help="in RAM: rounds of one child per engine, alternating which goes first; ratios are "
                        "the median of the rounds' ratios")
    p.add_argument("--prompt", type=int, default=64, help="prefill prompt tokens")
    p.add_argument("--warmup", type=int, default=4, help="out of RAM: decode tokens before measuring")
    p.add_argument("--n-ctx", type=int, default=None)
    p.add_argument("--strata-args", default="{}", help="JSON dict of keyword arguments for strata.load")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "strata-bench")
    p.add_argument("--small", action="store_true", help="smoke run: tiny files, few tokens")
    p.add_argument("--out-of-ram", action="store_true", help="figure 2: Strata inside a memory cgroup")
    p.add_argument("--ratio", type=float, default=2.6, help="out of RAM: file size / cgroup limit")
    p.add_argument("--min-limit-mib", type=int, default=None, help="out of RAM: floor of the cgroup limit")
    p.add_argument("--read-gib", type=float, default=2.0, help="out of RAM: bytes per O_DIRECT rate pass")
    p.add_argument("--compute-bound", action="store_true",
                   help="out of RAM: also decode the file in RAM (outside the cgroup, experts read in place) "
                        "for the compute-bound rate")
    p.add_argument("--with-llama", action="store_true",
                   help="out of RAM: then llama.cpp in the same cgroup, on a fresh cold copy")
    p.add_argument("--llama-cap-s", type=float, default=240.0,
                   help="out of RAM: stop llama.cpp's timed decode after this many seconds")
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", choices=("llama", "strata"), help=argparse.SUPPRESS)
    p.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if not isinstance(json.loads(a.strata_args), dict):
        p.error(f"--strata-args must be a JSON object, found {a.strata_args!r}")
    if a.child:
        print(json.dumps(child_llama(a) if a.child == "llama" else child_strata(a)))
        return 0
    a.shapes = a.shapes or ("tiny,tiny-mixtral" if a.small else "medium,mixtral")
    if a.shapes == "iquants":
        a.shapes = ",".join(f"{'tiny' if a.small else 'medium'}@{f}" for f in IQUANT_FTYPES)
    a.shape = a.shape or ("small" if a.small else "large")
    a.n = a.n or (8 if a.small else 16 if a.out_of_ram else 32)
    if a.rounds < 1:
        p.error(f"--rounds {a.rounds}: at least one round per engine")
    a.reps = 2 if a.small and a.reps == 3 else a.reps
    # The small out-of-RAM file (0.23 GB) cannot hold Python in a cgroup 2.6x smaller: the cgroup
    # gets a floor and the budgets stay small, so the tiers still read experts from the disk.
    a.min_limit_mib = a.min_limit_mib if a.min_limit_mib is not None else 1024 if a.small else 0
    a.small_budgets = {"device_mem": "128M", "host_mem": "48M", "paged": "176M"}
    a.n_ctx = a.n_ctx or max(256, a.prompt + DECODE_PROMPT + a.warmup + a.n + 16)
    unknown = [s for s in (a.shapes.split(",") + [a.shape]) if s.partition("@")[0] not in SHAPES]
    if unknown:
        p.error(f"unknown shapes {unknown}: expected some of {sorted(SHAPES)}")
    report = out_of_ram(a) if a.out_of_ram else in_ram(a)
    print(json.dumps(report, indent=2) if a.json else
          format_out_of_ram(report) if a.out_of_ram else format_in_ram(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
