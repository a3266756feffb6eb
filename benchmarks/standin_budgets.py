"""Benchmark (issue 28, point 3): miss stand-ins out of RAM, their speed gained and quality lost, per budget.

    python benchmarks/standin_budgets.py [--shape large-routed] [--limits-gib 2.13 3.0 4.0 4.6]
        [--stand-in q2_k] [--modes off background instead] [-n 32] [--warmup 32] [--score 256] [--json]
    python benchmarks/standin_budgets.py --small      # smoke run on the small shape (minutes)

For each memory limit (a v1 memory cgroup, the RAM a user has for the process; page cache
counted), the file (benchmarks/synthetic_moe.py SHAPES, cached in --workdir) runs in a child inside
it with the paged memory's budget the limit less the resident weights and the process's own
overhead, three ways: stand-ins off; `--miss-stand-in TYPE` in background mode (a miss computed
from its stand-in, the full expert still read for its next use); in instead mode (read only into a
free slot). Each child:
  decode: greedy, after an 8-token prompt and `warmup` tokens, `n` tokens timed: tok/s, expert
          bytes read from the disk per token, the share of expert uses served by a stand-in;
  quality: the first `score` tokens of a held-out text (this file's docstring and docs/memory.md,
          in the file's tokenizer) scored one token per forward pass (`Model.perplexity(...,
          batch_size=1)`: misses met as decoding meets them), the logits kept;
against a reference child outside any cgroup with every expert read in place (memory "direct",
the file's pages cached first): its decode rate (what compute alone allows) and its logits, from
which each child's KL divergence (mean, nats) and top-1 agreement are computed
(`strata.engine.compare_logits`, as `strata perplexity --kl-divergence`). Stand-ins stored beside the
file (`strata convert --add-stand-ins TYPE FILE`, MODEL.standins.gguf) are copied at load; without
them each child quantizes every expert at load (minutes for the large shapes). The expert reads
go around the page cache (the pager's O_DIRECT), so the disk is read on every miss.
A stand-in child whose stand-ins do not fit its budget reports the engine's refusal.
Not a test: it asserts nothing.
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

from benchmarks.bench_files import add_child_args, child_load_args, model_file  # noqa: E402
from benchmarks.packed_vs_llama import _peak_rss_kib, strata_decode  # noqa: E402
from benchmarks.tiered_cgroup import CGROUP_V1  # noqa: E402

#: Bytes a process needs beside the expert budget and the resident weights (Python, torch, the
#: native library, KV cache, the pager's buffers; as benchmarks/expert_parallel.py measured).
OVERHEAD = 448 << 20
CHILD_TIMEOUT = 1800.0
MODES = (("off", None), ("background", "background"), ("instead", "instead"))


def held_out_text() -> str:
    return (__doc__ or "") + (ROOT / "docs" / "memory.md").read_text(encoding="utf-8")


# -- one child ------------------------------------------------------------------------------------

def child(a: argparse.Namespace) -> dict:
    import torch

    import strata

    kwargs = child_load_args(a, max(256, a.score))
    if a.mode:
        kwargs.update(miss_stand_in=a.stand_in, stand_in_mode=a.mode)
    t0 = time.perf_counter()
    with strata.load(a.file, **kwargs) as model:
        load_s = time.perf_counter() - t0
        run = strata_decode(model, a.n, a.warmup)
        ids = model.tokenize(held_out_text())[:a.score]
        t = time.perf_counter()
        scored = model.perplexity(ids, n_ctx=len(ids), keep_logits=True, batch_size=1)
        score_s = time.perf_counter() - t
        torch.save(scored.logits, a.logits_out)
        slots = getattr(getattr(model.memory, "host", None), "slots_per_layer", None)
        return {"load_s": load_s, "decode": run, "ppl": scored.ppl, "score_tok_s": len(ids) / score_s,
                "slots_per_layer": slots, "n_experts": model.hparams.n_experts, "memory": repr(model.memory),
                "peak_rss_kib": _peak_rss_kib()}


# -- the parent -----------------------------------------------------------------------------------

def run_child(a: argparse.Namespace, memory: str, logits_out: Path, host_mem: int = 0, mode: str | None = None,
              limit: int | None = None) -> dict:
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--file", str(a.file), "--memory", memory,
            "--host-mem", str(host_mem), "--mode", mode or "", "--stand-in", a.stand_in, "-n", str(a.n),
            "--warmup", str(a.warmup), "--score", str(a.score), "--threads", str(a.threads),
            "--logits-out", str(logits_out)]
    group = None
    if limit is not None:
        group = CGROUP_V1 / f"strata-standin-bench-{os.getpid()}"
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit))
    preexec = (lambda: (group / "cgroup.procs").write_text(str(os.getpid()))) if group else None
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, preexec_fn=preexec,
                              timeout=CHILD_TIMEOUT)
        result = {"wall_s": time.perf_counter() - t0, "returncode": done.returncode}
        if group is not None:
            result["cgroup_peak_bytes"] = int((group / "memory.max_usage_in_bytes").read_text())
            result["cgroup_failcnt"] = int((group / "memory.failcnt").read_text())
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {CHILD_TIMEOUT:.0f} s"}
    finally:
        if group is not None:
            group.rmdir()
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return {**result, "error": (lines[-1] if lines else "killed (no output)")[:400]}
    return {**result, **json.loads(done.stdout.strip().splitlines()[-1])}


def figures(run: dict, base_logits, logits_path: Path) -> dict:
    """The child's decode and quality figures, its logits compared with the reference's."""
    import torch

    from strata.engine import compare_logits

    d = run["decode"]
    stats = d["stats"] or {}
    out = {"tok_s": d["tok_s"], "disk_mib_per_token": stats.get("bytes_disk", 0) / d["tokens"] / 2**20,
           "stand_in_share": stats.get("stand_ins", 0) / max(stats.get("requests", 0), 1),
           "ppl": run["ppl"], "slots_per_layer": run.get("slots_per_layer"), "load_s": run["load_s"],
           "cgroup_peak_gib": run.get("cgroup_peak_bytes", 0) / 2**30}
    out["kl"] = compare_logits(base_logits, torch.load(logits_path, weights_only=True)).to_dict()
    return out


def main_run(a: argparse.Namespace) -> dict:
    import torch

    from strata.gguf import open_model

    if not os.access(CGROUP_V1, os.W_OK):
        raise SystemExit(f"{CGROUP_V1} is not writable (needs root and cgroup v1)")
    a.file = model_file(a.workdir, a.shape)
    with open_model(a.file) as mf:
        resident = sum(t.nbytes for t in mf.resident.values())
        experts = sum(t.nbytes for t in mf.tensors.values()) - resident
    report = {"file": str(a.file), "file_bytes": a.file.stat().st_size, "expert_bytes": experts,
              "stand_in": a.stand_in, "threads": a.threads, "n": a.n, "warmup": a.warmup, "score": a.score,
              "limits": []}
    with tempfile.TemporaryDirectory() as tmp:
        base_path = Path(tmp) / "base.pt"
        with open(a.file, "rb") as f:  # into the page cache: the reference computes from RAM
            while f.read(1 << 24):
                pass
        base = run_child(a, "direct", base_path)
        if "error" in base:
            raise SystemExit(f"the reference run failed: {base['error']}")
        base_logits = torch.load(base_path, weights_only=True)
        report["in_ram"] = {"tok_s": base["decode"]["tok_s"], "ppl": base["ppl"]}
        budgets = a.budgets_mib or [None] * len(a.limits_gib)
        for gib, budget in zip(a.limits_gib, budgets, strict=True):
            limit = int(gib * 2**30)
            host_mem = limit - resident - OVERHEAD if budget is None else budget << 20
            row = {"limit_gib": gib, "host_mem": host_mem, "modes": {}}
            for name, mode in ((n, m) for n, m in MODES if n in a.modes):
                out = Path(tmp) / f"{gib}-{name}.pt"
                run = run_child(a, "paged", out, host_mem, mode, limit)
                row["modes"][name] = {"error": run["error"]} if "error" in run else figures(run, base_logits, out)
                print(f"{gib} GiB {name}: {json.dumps(row['modes'][name])}", file=sys.stderr, flush=True)
            report["limits"].append(row)
    return report


def format_report(r: dict) -> str:
    lines = [f"{r['file']}: {r['file_bytes'] / 2**30:.2f} GiB, experts {r['expert_bytes'] / 2**30:.2f} GiB; "
             f"{r['stand_in']} stand-ins; {r['threads']} threads; {r['n']} tokens timed after {r['warmup']}; "
             f"{r['score']} tokens scored one per pass",
             f"in RAM (memory direct): {r['in_ram']['tok_s']:.2f} tok/s, PPL {r['in_ram']['ppl']:.3f}",
             "| limit | budget | stand-ins | tok/s | vs off | disk MiB/token | stand-in share | KL mean | top-1 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in r["limits"]:
        off = row["modes"].get("off", {}).get("tok_s")
        for name, m in row["modes"].items():
            head = f"| {row['limit_gib']:g} GiB | {row['host_mem'] / 2**30:.2f} GiB | {name} |"
            if "error" in m:
                lines.append(f"{head} {m['error'][:120]} | | | | | |")
                continue
            gain = f"{m['tok_s'] / off:.2f}x" if off else "-"
            lines.append(f"{head} {m['tok_s']:.2f} | {gain} | {m['disk_mib_per_token']:.1f} | "
                         f"{m['stand_in_share']:.2f} | {m['kl']['kl_mean']:.4f} | {m['kl']['top1_agreement']:.3f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="large-routed")
    p.add_argument("--limits-gib", type=float, nargs="+", default=[2.13, 3.0, 4.0, 4.6],
                   help="memory cgroup limits (default: large-routed at ratio 2.6, then larger)")
    p.add_argument("--budgets-mib", type=int, nargs="+", default=None,
                   help="the paged memory's budget under each limit (default: the limit less the resident "
                        "weights and the process's overhead)")
    p.add_argument("--stand-in", default="q2_k")
    p.add_argument("--modes", nargs="+", choices=[n for n, _ in MODES], default=[n for n, _ in MODES],
                   help="which runs under each limit (default: all three)")
    p.add_argument("-n", type=int, default=32)
    p.add_argument("--warmup", type=int, default=32)
    p.add_argument("--score", type=int, default=256, help="tokens of the held-out text scored")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/strata-bench"))
    p.add_argument("--small", action="store_true",
                   help="the small shape (0.24 GB) in a 1 GiB limit, budgets of 160 and 200 MiB, 8 + 8 tokens")
    p.add_argument("--json", action="store_true")
    add_child_args(p)
    p.add_argument("--mode", default="", help=argparse.SUPPRESS)
    p.add_argument("--logits-out", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        a.mode = a.mode or None
        print(json.dumps(child(a)))
        return 0
    if a.small:
        a.shape, a.limits_gib, a.budgets_mib, a.n, a.warmup, a.score = "small", [1.0, 1.0], [160, 200], 8, 8, 64
    report = main_run(a)
    print(json.dumps(report) if a.json else format_report(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
