"""Benchmark: Strata beside llama.cpp on the same synthetic GGUF files, same threads, one run.

    python benchmarks/packed_vs_llama.py [--shapes medium,mixtral] [--threads 2] [-n 32] [--reps 3]
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
ratios Strata / llama.cpp of the means. The children run one after the other, not interleaved,
so load from other processes can favour either: compare only figures from one run, and run on a
quiet machine: llama.cpp's OpenMP threads spin while they wait, so on oversubscribed cores its
figures collapse (medium decoded at 2 tok/s, not 64-83, with a load average of 7 on 2 cores).
Each shape's report also says which ISA each engine ran: llama.cpp's `llama_print_system_info()`
features, Strata's default kernel family and, per ggml type in the file (with its share of the
file's tensor bytes), the family of the packed kernel its table hands out (native.type_support).

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
import hashlib
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

from benchmarks.synthetic_moe import SHAPES, write, write_converted  # noqa: E402

DECODE_PROMPT = 8  # tokens before a decode run
CHILD_TIMEOUT = 1200.0
#: llama.cpp file types of the `iquants` shapes (issue 23: what i-quant MoE files are published in).
IQUANT_FTYPES = ("IQ4_XS", "IQ3_S", "IQ2_XS", "Q2_K")


# -- files ------------------------------------------------------------------------------------

def model_file(workdir: Path, shape: str) -> Path:
    """The cached file of `shape` (written on first use); its name carries a hash of the shape."""
    spec = SHAPES[shape]
    digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]
    path = workdir / f"{shape}-{digest}.gguf"
    if not path.exists():
        workdir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        t0 = time.perf_counter()
        (write_converted if "fixture" in spec else write)(tmp, **spec)
        tmp.rename(path)
        print(f"wrote {path} ({_size(path.stat().st_size)}) in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)
    return path


def shape_file(workdir: Path, shape: str) -> Path:
    """The cached file of `shape`: a SHAPES name, or BASE@FTYPE (BASE requantized by llama.cpp)."""
    base, _, ftype = shape.partition("@")
    src = model_file(workdir, base)
    if not ftype:
        return src
    path = src.with_name(f"{src.stem}-{ftype}.gguf")
    if not path.exists():
        tmp = path.with_suffix(".partial")
        t0 = time.perf_counter()
        llama_requantize(src, tmp, ftype)
        tmp.rename(path)
        print(f"wrote {path} ({_size(path.stat().st_size)}) in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return path


def ones_imatrix(src: Path) -> dict:
    """An importance matrix of ones for every weight matrix of `src`: per tensor name, float32
    [n_experts * K] (llama.cpp's layout: one row of K importances per expert; K = ne[0])."""
    import numpy as np
    from gguf import GGUFReader

    out = {}
    for t in GGUFReader(src).tensors:
        shape = [int(x) for x in t.shape]  # ggml order: K first
        if len(shape) >= 2 and t.name.endswith(".weight"):
            out[t.name] = np.ones(shape[0] * (shape[2] if len(shape) > 2 else 1), dtype=np.float32)
    return out


def llama_requantize(src: Path, out: Path, ftype: str, n_threads: int = 2) -> None:
    """`llama-quantize --allow-requantize --imatrix (ones) SRC OUT FTYPE`, in process."""
    import ctypes

    import llama_cpp as ll

    code = getattr(ll, f"LLAMA_FTYPE_MOSTLY_{ftype}", None)
    if code is None:
        raise SystemExit(f"{out.name}: unknown llama.cpp file type {ftype!r} (LLAMA_FTYPE_MOSTLY_{ftype})")
    params = ll.llama_model_quantize_default_params()
    params.nthread, params.ftype, params.allow_requantize = n_threads, code, True
    entries = ones_imatrix(src)
    arr = (ll.llama_model_imatrix_data * (len(entries) + 1))()  # zeroed last entry: the terminator
    for slot, (name, data) in zip(arr, entries.items()):
        slot.name, slot.data, slot.size = name.encode(), data.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), data.size
    params.imatrix = arr  # `entries` and `arr` stay alive until the call returns
    if ll.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama_model_quantize {src} -> {out} ({ftype}) failed (its log is on stderr)")


def file_types(path: Path) -> dict[str, float]:
    """Share of the file's tensor bytes per ggml type name, largest first."""
    from gguf import GGUFReader

    sizes: dict[str, int] = {}
    for t in GGUFReader(path).tensors:
        sizes[t.tensor_type.name] = sizes.get(t.tensor_type.name, 0) + int(t.n_bytes)
    total = sum(sizes.values()) or 1
    return {k: v / total for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])}


def prompt_ids(n: int) -> list[int]:
    """`n` fixed pseudo-random ordinary tokens (the synthetic vocabulary's bytes and one merge)."""
    import numpy as np

    return np.random.default_rng(1234).integers(0, 257, n).tolist()


def cold_copy(src: Path, dst: Path) -> float:
    """Copy `src` to `dst` with O_DIRECT on both sides (no page of `dst` cached); seconds taken."""
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=8M", "iflag=direct", "oflag=direct", "status=none"],
                   check=True)
    return time.perf_counter() - t0


# -- children: one engine each -----------------------------------------------------------------

def spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "runs": values}


def child_llama(a: argparse.Namespace) -> dict:
    import numpy as np
    from llama_cpp import Llama

    if a.out_of_ram:  # no repacking into anonymous copies: in a memory limit they are killed (FACTS.md)
        import llama_cpp.llama_cpp as lib

        default = lib.llama_model_default_params

        def without_repack():
            params = default()
            params.use_extra_bufts = False
            return params
        lib.llama_model_default_params = without_repack
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
    return {"engine": "llama.cpp", "load_s": load_s, "isa": llama_isa(),
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

    return {"default": native.default_impl(),
            "types": {name: {"share": share, "runs": native.type_support(name).runs}
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

def in_ram(a: argparse.Namespace) -> dict:
    shapes = []
    for shape in a.shapes.split(","):
        path = shape_file(a.workdir, shape)
        row = {"shape": shape, "spec": SHAPES[shape.partition("@")[0]], "file": str(path),
               "file_bytes": path.stat().st_size,
               "llama": run_child("llama", path, a), "strata": run_child("strata", path, a)}
        for what in ("decode_tok_s", "prefill_tok_s"):
            if what in row["llama"] and what in row["strata"]:
                row[f"{what.split('_')[0]}_ratio"] = row["strata"][what]["mean"] / row["llama"][what]["mean"]
        shapes.append(row)
    return {"mode": "in-ram", "threads": a.threads, "n": a.n, "reps": a.reps, "prompt": a.prompt,
            "strata_args": json.loads(a.strata_args), "shapes": shapes}


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


# -- output -------------------------------------------------------------------------------------

def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _rate(r: dict | None) -> str:
    if not r:
        return "-"
    return f"{r['mean']:8.2f} +- {r['std']:6.2f} ({r['min']:.2f}-{r['max']:.2f})"


def format_in_ram(r: dict) -> str:
    lines = [f"threads {r['threads']}; prefill {r['prompt']} tokens x {r['reps']}, decode {r['n']} tokens x "
             f"{r['reps']}; strata.load args {json.dumps(r['strata_args'])}",
             f"{'shape':<13} {'engine':<18} {'prefill tok/s: mean +- std (min-max)':<40} decode tok/s"]
    for s in r["shapes"]:
        head = f"{s['shape']:<13}"
        for key, name in (("llama", "llama.cpp"), ("strata", "strata")):
            x = s[key]
            body = (f"FAILED: {x['error']}" if "error" in x else
                    f"{_rate(x.get('prefill_tok_s')):<40} {_rate(x.get('decode_tok_s'))}")
            lines.append(f"{head} {name:<18} {body}")
            head = _size(s["file_bytes"]).ljust(13)
        if "decode_ratio" in s:
            lines.append(f"{'':<13} {'strata/llama.cpp':<18} {s['prefill_ratio']:8.2f}x{'':<31} "
                         f"{s['decode_ratio']:8.2f}x")
        lines += _isa_lines(s)
    return "\n".join(lines)


def _isa_lines(s: dict) -> list[str]:
    """Which ISA each engine ran on one shape's file."""
    lines = []
    if "isa" in s["llama"]:
        lines.append(f"{'':<13} {'llama.cpp ISA':<18} {s['llama']['isa']}")
    if "isa" in s["strata"]:
        isa = s["strata"]["isa"]
        kernels = ", ".join(f"{name} {100 * t['share']:.0f}% {t['runs'] or 'no packed kernel'}"
                            for name, t in isa["types"].items())
        lines.append(f"{'':<13} {'strata ISA':<18} {isa['default']}; per type (share of bytes, kernel): {kernels}")
    return lines


def format_out_of_ram(r: dict) -> str:
    x = r["strata"]
    lines = [f"{r['file']}: {_size(r['file_bytes'])}, cold copy ({r['copy_s']:.0f} s), memory cgroup "
             f"{r['limit_bytes'] / 2**30:.2f} GiB = file / {r['file_bytes'] / r['limit_bytes']:.2f}; threads "
             f"{r['threads']}; strata.load args {json.dumps(r['strata_args'])}",
             f"  O_DIRECT sequential read: {r['read_bytes_per_s']['before'] / 1e9:.2f} GB/s before, "
             f"{r['read_bytes_per_s']['after'] / 1e9:.2f} after the decode"]
    if "slab_read_bytes_per_s" in r:
        lines.append(f"  O_DIRECT expert slabs in random order, 16 in flight (the pager's default threads): "
                     f"{r['slab_read_bytes_per_s']['before'] / 1e9:.2f} GB/s before, "
                     f"{r['slab_read_bytes_per_s']['after'] / 1e9:.2f} after")
    if "error" in x:
        return "\n".join(lines + [f"  strata FAILED ({x.get('returncode')}): {x['error']}"])
    run = x["decode"]
    lines.append(f"  strata decode: {run['tok_s']:.2f} tok/s over {run['tokens']} tokens (after warm-up); peak RSS "
                 f"{x['self_peak_rss_kib'] / 1024:.0f} MiB, cgroup peak {x['cgroup_peak_bytes'] / 2**20:.0f} MiB, "
                 f"failcnt {x['cgroup_failcnt']}")
    if "disk_bytes_per_token" in r:
        lines.append(f"  expert bytes read from disk per token: {r['disk_bytes_per_token'] / 2**20:.1f} MiB")
    for bound, what in (("disk_bound", "disk-bound rate"),
                        ("slab_disk_bound", "disk-bound rate at the random-slab read rate")):
        if f"{bound}_tok_s" in r:
            lines.append(f"  {what}: {r[f'{bound}_tok_s']:.2f} tok/s; strata reaches "
                         f"{100 * r[f'share_of_{bound}']:.0f}% of it")
    if "compute_bound_tok_s" in r:
        lines.append(f"  compute-bound rate (the same decode in RAM, experts read in place): "
                     f"{r['compute_bound_tok_s']:.2f} tok/s; strata reaches {100 * r['share_of_bound']:.0f}% of the "
                     f"lower bound ({r['bound_tok_s']:.2f} tok/s)")
    elif "in_ram" in r:
        lines.append(f"  compute-bound run FAILED: {r['in_ram'].get('error')}")
    if "per_token_s" in r:
        t = r["per_token_s"]
        parts = ", ".join(f"{k[:-2]} {1e3 * v:.1f}" for k, v in t.items() if k not in ("total", "other"))
        lines.append(f"  per token (ms): total {1e3 * t['total']:.1f}; {parts}; the rest {1e3 * t['other']:.1f}")
    lines.append(f"  memory: {x['memory']}")
    y = r.get("llama")
    if y is not None and "error" in y:
        lines.append(f"  llama.cpp FAILED ({y.get('returncode')}): {y['error']}")
    elif y is not None:
        d = y["decode"]
        lines.append(f"  llama.cpp decode (same cgroup, fresh cold copy): {d['tok_s']:.3f} tok/s over {d['tokens']} "
                     f"tokens ({d['seconds']:.0f} s); cgroup peak {y['cgroup_peak_bytes'] / 2**20:.0f} MiB, failcnt "
                     f"{y['cgroup_failcnt']}; strata/llama.cpp {run['tok_s'] / d['tok_s']:.1f}x" if d["tokens"] else
                     f"  llama.cpp decode: no token within {d['seconds']:.0f} s")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=None, help="in RAM: comma-separated SHAPES or BASE@FTYPE (default "
                   "medium,mixtral; 'iquants': medium@IQ4_XS,medium@IQ3_S,medium@IQ2_XS,medium@Q2_K)")
    p.add_argument("--shape", default=None, help="out of RAM: the shape (default large)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("-n", type=int, default=None, help="decode tokens per run (default 32; out of RAM 16)")
    p.add_argument("--reps", type=int, default=3)
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
