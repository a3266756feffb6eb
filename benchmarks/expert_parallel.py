"""Benchmark (issue 29): expert parallelism on one machine, one process against two ranks.

    python benchmarks/expert_parallel.py [--shape large-routed] [-n 32] [--warmup 32] [--json]
    python benchmarks/expert_parallel.py --small [--json]      # smoke run on the tiny file (seconds)

Four greedy decodes of the same file (benchmarks/synthetic_moe.py SHAPES; cached in --workdir),
each after an 8-token prompt and `warmup` tokens, `n` tokens timed:
  (a) one process, 2 threads, inside a v1 memory cgroup of `share` x the file (default 0.6), the
      paged memory's budget the limit less the resident weights and the process's own overhead;
  (b) two ranks (subprocesses with the environment torchrun sets: RANK, WORLD_SIZE, MASTER_ADDR,
      MASTER_PORT), each in its own cgroup of the same size with the same budget, holding half of
      the experts (`strata.distributed`'s shard plan), 1 thread each, pinned to its own core
      (sched_setaffinity);
  (c) the same two in RAM: no cgroup, experts read in place from the file (memory "direct"), its
      pages cached first: what the exchanges cost on one machine; and `rounds` bare all-gathers
      of one token's row between two ranks pinned as in (b), then as many exchanges of it
      through shared memory: the collective's latency alone.
The ranks of (b) and (c) share one machine, so they add their partial sums through shared
memory (strata/distributed/shared.py); STRATA_EP_SHM=0 in the environment makes them use gloo.
(a) and (b) read a cold copy of the file (`dd` with O_DIRECT; its pages dropped again with
posix_fadvise before each run), whose O_DIRECT sequential read rate is measured first. Each run
reports, per rank: decode tok/s, expert bytes read from the disk per token, bytes over the network
per token (the all-gathers' payload sent and received; the broadcast of rank 0's tokens apart), and
the time split per token: compute, disk wait, collective (the MoE layers' all-gathers, waiting for
the slower rank included) and the rest (sampling, scheduling, the broadcast). The issue's target:
(b) at least 2x (a).

--small: the tiny shape, the cgroups floored at 1 GiB (Python alone needs more) and the budget half
the experts' bytes, 4 + 4 tokens; without a writable cgroup v1 (not root) the cgroup runs are
skipped and said so. Not a test: it asserts nothing (tests/distributed/test_benchmark.py runs --small).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_files import add_child_args, child_load_args, cold_copy, model_file, prompt_ids  # noqa: E402
from benchmarks.tiered_cgroup import CGROUP_V1  # noqa: E402

DECODE_PROMPT = 8
CHILD_TIMEOUT = 1800.0
#: Bytes a process needs beside the expert budget and the resident weights (Python, torch, the
#: native library, KV cache, the pager's buffers): the peak measured above the budget plus a margin
#: (benchmarks/RESULTS.md, "Figures behind code comments").
OVERHEAD = 448 << 20


# -- one engine (a child process, or one rank) ---------------------------------------------------

def child_allgather(a: argparse.Namespace) -> dict:
    """One rank's bare all-gathers of one token's partial sum (a float32 row of the file's hidden
    size), `rounds` of them after 50 untimed: the collective's latency without a model."""
    import torch
    import torch.distributed as dist

    from strata.gguf import open_model

    with open_model(a.file) as mf:
        D = mf.hparams.n_embd
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    row = torch.randn(1, D)
    parts = [torch.empty_like(row) for _ in range(dist.get_world_size())]
    rank = dist.get_rank()
    shared = None
    try:
        for _ in range(50):
            dist.all_gather(parts, row)
        t = time.perf_counter()
        for _ in range(a.rounds):
            dist.all_gather(parts, row)
        seconds = time.perf_counter() - t
        from strata.distributed.group import ExpertParallel
        from strata.distributed.shared import SharedSums

        shared, out = SharedSums.open(ExpertParallel(rank, dist.get_world_size())), torch.empty_like(row)
        shared_s = None
        if shared is not None:  # the same exchange through shared memory (the ranks' default on one machine)
            for seq in range(1, 51):
                shared.exchange.sum(seq, row, out, 60.0)
            t = time.perf_counter()
            for seq in range(51, 51 + a.rounds):
                shared.exchange.sum(seq, row, out, 60.0)
            shared_s = time.perf_counter() - t
    finally:
        if shared is not None:
            shared.close()
        dist.destroy_process_group()
    return {"rank": rank, "row_bytes": 4 * D, "ms_per_allgather": 1e3 * seconds / a.rounds,
            "ms_per_shared_sum": None if shared_s is None else 1e3 * shared_s / a.rounds,
            "cpus": sorted(os.sched_getaffinity(0))}


def child(a: argparse.Namespace) -> dict:
    import strata
    from strata.bench.expert_parallel import figures, snapshot

    ep = None
    if "RANK" in os.environ:
        from strata.distributed import ExpertParallel

        ep = ExpertParallel.from_env(timeout_s=600)
    t0 = time.perf_counter()
    try:
        with strata.load(a.file, expert_parallel=ep, **child_load_args(a, 256)) as model:
            load_s = time.perf_counter() - t0
            stream = model.generate(prompt_ids(DECODE_PROMPT), max_tokens=1 + a.warmup + a.n, temperature=0,
                                    stream=True, stop_token_ids=())
            seen, before, t = 0, None, None
            for _ in stream:
                seen += 1
                if seen == 1 + a.warmup:  # the prompt's token and the warm-up tokens are out
                    before, t = snapshot(model, ep), time.perf_counter()
            seconds = time.perf_counter() - t
            out = figures(before, snapshot(model, ep), seen - 1 - a.warmup, seconds)
    finally:
        if ep is not None:
            ep.close()
    return {**out, "load_s": load_s, "cpus": sorted(os.sched_getaffinity(0)), "peak_rss_kib": _peak_rss_kib()}


def _peak_rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


# -- the parent: launching, cgroups -------------------------------------------------------------

def _cgroup(name: str, limit: int) -> Path:
    group = CGROUP_V1 / f"strata-ep-bench-{os.getpid()}-{name}"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(limit))
    return group


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _drop_pages(path: Path) -> None:
    """Drop `path`'s clean pages from the page cache (this file's only, not the machine's)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _warm_pages(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def launch(a: argparse.Namespace, path: Path, world: int, limit: int | None, memory: str, extra: tuple = ()) -> dict:
    """One configuration: `world` processes (1: plain, 2 threads; more: ranks, 1 thread each pinned
    to core rank % cores), each in its own cgroup of `limit` bytes when given."""
    cores = sorted(os.sched_getaffinity(0))
    groups = [_cgroup(f"r{r}", limit) for r in range(world)] if limit else []
    port = _free_port()
    procs = []
    try:
        for r in range(world):
            env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
            threads, cpus = a.threads, None
            if world > 1:
                env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port), OMP_NUM_THREADS="1")
                threads, cpus = 1, {cores[r % len(cores)]}
            argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--file", str(path), "--threads",
                    str(threads), "-n", str(a.n), "--warmup", str(a.warmup), "--memory", memory,
                    "--host-mem", str(a.host_mem), *extra]
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          preexec_fn=_enter(groups[r] if groups else None, cpus)))
        return _collect(procs, groups)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for g in groups:
            g.rmdir()


def _enter(group: Path | None, cpus: set[int] | None):
    def enter() -> None:  # in the child, before exec: its memory limit and its cores
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
    return enter


def _collect(procs: list[subprocess.Popen], groups: list[Path]) -> dict:
    t0, ranks = time.perf_counter(), []
    for i, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(CHILD_TIMEOUT - (time.perf_counter() - t0), 1.0))
        except subprocess.TimeoutExpired:
            return {"error": f"process {i} timed out after {CHILD_TIMEOUT:.0f} s"}
        if p.returncode != 0:
            return {"error": f"process {i} exited {p.returncode}: {(err.strip().splitlines() or ['killed'])[-1]}"}
        rank = json.loads(out.strip().splitlines()[-1])
        if groups:
            rank["cgroup_peak_bytes"] = int((groups[i] / "memory.max_usage_in_bytes").read_text())
            rank["cgroup_failcnt"] = int((groups[i] / "memory.failcnt").read_text())
        ranks.append(rank)
    return {"ranks": ranks}


# -- the four runs ------------------------------------------------------------------------------

def budgets(a: argparse.Namespace, path: Path) -> tuple[int, int, dict]:
    """(cgroup limit, paged budget, the file's sizes): the limit `share` x the file (floored in
    --small); the budget what the limit leaves past the resident weights and OVERHEAD (in --small:
    half the experts' bytes, so the single process still reads from the disk)."""
    from strata.gguf import open_model
    from strata.memory.budget import host_budget_for_slots

    size = path.stat().st_size
    with open_model(path) as mf:
        experts = sum(s.nbytes for layer in mf.expert_layers for e in range(mf.hparams.n_experts)
                      for s in mf.expert_slabs(layer, e))
        floor = host_budget_for_slots(mf, mf.hparams.n_experts_used)
        n_layers = len(mf.expert_layers)
    limit = max(int(a.share * size), 1 << 30 if a.small else 0)
    budget = experts // 2 if a.small else limit - (size - experts) - OVERHEAD
    return limit, max(budget, floor), {"file_bytes": size, "expert_bytes": experts, "resident_bytes": size - experts,
                                       "n_layers": n_layers}


def run_all(a: argparse.Namespace) -> dict:
    from strata.memory.placement import sequential_direct_rate

    src = model_file(a.workdir, a.shape)
    limit, a.host_mem, sizes = budgets(a, src)
    report = {"shape": a.shape, "file": str(src), **sizes, "limit_bytes": limit, "host_mem": a.host_mem,
              "n": a.n, "warmup": a.warmup, "cores": len(os.sched_getaffinity(0)), "runs": {}}
    if os.access(CGROUP_V1, os.W_OK):
        cold = a.workdir / f"cold-ep-{os.getpid()}-{src.name}"
        try:
            report["copy_s"] = cold_copy(src, cold)
            report["read_bytes_per_s"] = sequential_direct_rate(cold, limit=int(a.read_gib * 2**30))[0]
            for name, world in (("one_process_cgroup", 1), ("two_ranks_cgroup", 2)):
                _drop_pages(cold)
                report["runs"][name] = launch(a, cold, world, limit, "paged")
        finally:
            cold.unlink(missing_ok=True)
    else:
        report["cgroups"] = f"{CGROUP_V1} is not writable (needs root and cgroup v1): the cgroup runs are skipped"
    _warm_pages(src)
    for name, world in (("one_process_ram", 1), ("two_ranks_ram", 2)):
        report["runs"][name] = launch(a, src, world, None, "direct")
    report["allgather"] = launch(a, src, 2, None, "direct", ("--allgather", "--rounds", str(a.rounds)))
    for where in ("cgroup", "ram"):
        one, two = (report["runs"].get(f"{k}_{where}", {}).get("ranks") for k in ("one_process", "two_ranks"))
        if one and two:
            report[f"speedup_{where}"] = two[0]["tok_s"] / one[0]["tok_s"]
    return report


# -- output -------------------------------------------------------------------------------------

def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def format_report(r: dict) -> str:
    lines = [f"{r['file']}: {_size(r['file_bytes'])} ({_size(r['expert_bytes'])} experts); cgroups of "
             f"{_size(r['limit_bytes'])}, paged budget {_size(r['host_mem'])}; {r['n']} tokens "
             f"timed after {r['warmup']}; {r['cores']} cores"]
    if "cgroups" in r:
        lines.append(f"  {r['cgroups']}")
    if "read_bytes_per_s" in r:
        lines.append(f"  cold copy: O_DIRECT sequential read {r['read_bytes_per_s'] / 1e9:.2f} GB/s")
    lines.append(f"  {'run':<20} {'rank':>4} {'tok/s':>7} {'disk MiB/tok':>12} {'sums KiB/tok':>12} "
                 f"{'compute':>8} {'disk wait':>9} {'collective':>10} {'rest':>6}  (ms per token)")
    for name, run in r["runs"].items():
        if "error" in run:
            lines.append(f"  {name:<20} FAILED: {run['error']}")
            continue
        for x in run["ranks"]:
            ms = x["ms_per_token"]
            net = (x["net_bytes_sent_per_token"] + x["net_bytes_received_per_token"]) / 1024
            via = " (shared memory)" if x.get("shared_share") == 1 else ""
            lines.append(f"  {name:<20} {x['rank']:>4} {x['tok_s']:>7.2f} {x['disk_bytes_per_token'] / 2**20:>12.2f} "
                         f"{net:>12.1f} {ms['compute']:>8.1f} {ms['disk_wait']:>9.1f} {ms['collective']:>10.1f} "
                         f"{ms['rest']:>6.1f}{via}")
    ag = r.get("allgather", {})
    if "ranks" in ag:
        x, layers = ag["ranks"][0], r["n_layers"]
        lines.append(f"  bare all-gather of one row ({x['row_bytes']} bytes) between the two pinned ranks: "
                     f"{x['ms_per_allgather']:.3f} ms; x {layers} MoE layers = {x['ms_per_allgather'] * layers:.1f} ms "
                     f"per token")
        if x.get("ms_per_shared_sum") is not None:
            lines.append(f"  the same through shared memory (the ranks' default on one machine): "
                         f"{x['ms_per_shared_sum'] * 1e3:.1f} us; x {layers} = {x['ms_per_shared_sum'] * layers:.2f} ms")
    elif ag:
        lines.append(f"  bare all-gather FAILED: {ag['error']}")
    for where, what in (("cgroup", "out of RAM (cgroups)"), ("ram", "in RAM")):
        if f"speedup_{where}" in r:
            lines.append(f"  two ranks / one process, {what}: {r[f'speedup_{where}']:.2f}x")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default=None, help="benchmarks/synthetic_moe.py shape (default large-routed)")
    p.add_argument("-n", type=int, default=None, help="decode tokens timed (default 32; --small 4)")
    p.add_argument("--warmup", type=int, default=None,
                   help="decode tokens before timing (default 32; --small 4): a rank's first reads of its shard")
    p.add_argument("--share", type=float, default=0.6, help="cgroup limit as a share of the file")
    p.add_argument("--threads", type=int, default=2, help="threads of the single process")
    p.add_argument("--read-gib", type=float, default=2.0, help="bytes of the O_DIRECT read-rate pass")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "strata-bench")
    p.add_argument("--small", action="store_true", help="smoke run: the tiny file, a few tokens")
    p.add_argument("--json", action="store_true")
    add_child_args(p)
    p.add_argument("--allgather", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=None, help="bare all-gathers timed (default 1000; --small 50)")
    a = p.parse_args()
    a.n = a.n or (4 if a.small else 32)
    a.warmup = a.warmup if a.warmup is not None else 4 if a.small else 32
    a.rounds = a.rounds or (50 if a.small else 1000)
    if a.child:
        print(json.dumps(child_allgather(a) if a.allgather else child(a)))
        return 0
    a.shape = a.shape or ("tiny" if a.small else "large-routed")
    report = run_all(a)
    print(json.dumps(report, indent=2) if a.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
