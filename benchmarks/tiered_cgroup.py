"""Benchmark: a model file 3x a memory cgroup's limit decodes inside it; the pager's slab rate.

    python benchmarks/tiered_cgroup.py [--limit-mib 512] [--factor 3] [--tokens 32] [--direct-tokens 6]
        [--file PATH] [--keep] [--no-pager] [--json]

1. Writes a synthetic Qwen3-MoE GGUF of factor x limit bytes (benchmarks/synthetic_moe.py:
   hidden 1024, 208 experts of 0.88 MiB per layer, top-4, Q4_K; ~8 layers for 1.5 GiB) and drops
   its pages from the page cache.
2. In a child process confined by a memory cgroup (v1, needs root; page cache counts against the
   limit) of `limit` bytes, decodes `tokens` tokens through the tiered memory (packed device
   slots, budgets well inside the limit), then, side by side in a second child in the same
   cgroup, `direct-tokens` tokens through DirectExpertMemory (every expert read through the
   file's memory map, as a plain mmap engine does). Reports each child's peak RSS (VmHWM),
   the cgroup's peak usage and failcnt, decode tok/s, and the tiered memory's counters.
3. Runs `strata bench pager` on the same file (outside the cgroup): the disk's sequential
   O_DIRECT rate beside the pager reading every expert slab in random order.
Not a unit test.
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

from benchmarks.synthetic_moe import write  # noqa: E402

CGROUP_V1 = Path("/sys/fs/cgroup/memory")

CHILD = r"""
import json, resource, sys, time
import torch
import strata
from strata.memory import DirectExpertMemory
path, mode, tokens, device_mem, host_mem = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
torch.set_num_threads(2)
if mode == "tiered":
    model = strata.load(path, n_ctx=256, max_batch=1, device_mem=device_mem, host_mem=host_mem, slot_form="packed")
else:  # buffers for one token's experts only: the comparison is about where the experts come from
    model = strata.load(path, n_ctx=256, max_batch=1, memory=lambda mf, d, dt, n: DirectExpertMemory(
        mf, device=d, dtype=dt, n_threads=n, max_acquire=mf.hparams.n_experts_used))
prompt = torch.randint(0, model.hparams.vocab_size, (8,), generator=torch.Generator().manual_seed(0)).tolist()
stream = model.generate(prompt, max_tokens=tokens, temperature=1.0, top_k=0, seed=0, stream=True,
                        stop_token_ids=())
t0, n = None, 0
for _ in stream:
    n += 1
    if t0 is None:
        t0 = time.perf_counter()
        if model.memory_stats() is not None:
            model.memory_stats().reset()
seconds = time.perf_counter() - t0
stats = model.memory_stats()
status = dict(l.split(":", 1) for l in open("/proc/self/status") if l.startswith(("VmHWM", "VmRSS")))
print(json.dumps({"mode": mode, "decode_tok_s": (n - 1) / seconds, "tokens": stream.completion.token_ids,
                  "memory": repr(model.memory), "self_peak_rss_kib": int(status["VmHWM"].split()[0]),
                  "stats": stats.totals() if stats is not None else None}))
"""


def _cgroup(limit: int) -> Path:
    group = CGROUP_V1 / f"strata-tiered-bench-{os.getpid()}"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(limit))
    return group


def run_child(group: Path, path: Path, mode: str, tokens: int, device_mem: str, host_mem: str,
              timeout: float) -> dict:
    (group / "memory.max_usage_in_bytes").write_text("0")
    failcnt0 = int((group / "memory.failcnt").read_text())
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), mode, str(tokens), device_mem, host_mem],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                             preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        return {"mode": mode, "error": f"timed out after {timeout:.0f} s"}
    result = {"mode": mode, "wall_s": time.perf_counter() - t0, "returncode": child.returncode,
              "cgroup_peak_bytes": int((group / "memory.max_usage_in_bytes").read_text()),
              "cgroup_failcnt": int((group / "memory.failcnt").read_text()) - failcnt0}
    if child.returncode != 0:
        return {**result, "error": err.strip().splitlines()[-3:]}
    return {**result, **json.loads(out.strip().splitlines()[-1])}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit-mib", type=int, default=512)
    p.add_argument("--factor", type=float, default=3.0)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--direct-tokens", type=int, default=6)
    p.add_argument("--device-mem", default="128M", help="tiered run's device budget (RAM here)")
    p.add_argument("--host-mem", default="64M", help="tiered run's host budget")
    p.add_argument("--file", type=Path, default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--no-pager", action="store_true")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if not os.access(CGROUP_V1, os.W_OK):
        print(f"{CGROUP_V1} is not writable (needs root and cgroup v1)", file=sys.stderr)
        return 1
    limit = a.limit_mib << 20
    path = a.file or Path(tempfile.gettempdir()) / f"strata-tiered-{a.factor:g}x{a.limit_mib}m.gguf"
    wrote = not path.exists()
    if wrote:
        t0 = time.perf_counter()
        write(path, int(a.factor * limit), weight_scale=0.6)
        print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)
    report = {"file": str(path), "file_bytes": path.stat().st_size, "limit_bytes": limit, "runs": []}
    group = _cgroup(limit)
    try:
        report["runs"].append(run_child(group, path, "tiered", a.tokens, a.device_mem, a.host_mem, a.timeout))
        report["runs"].append(run_child(group, path, "direct", a.direct_tokens, "", "", a.timeout))
    finally:
        group.rmdir()
    if not a.no_pager:
        from strata.bench.pager import bench_pager

        report["pager"] = bench_pager(path, host=False)
    if wrote and not a.keep:
        path.unlink()
    print(json.dumps(report, indent=2) if a.json else _format(report))
    return 0


def _format(r: dict) -> str:
    lines = [f"{r['file']}: {r['file_bytes'] / 2**30:.2f} GiB = {r['file_bytes'] / r['limit_bytes']:.2f} x the "
             f"cgroup limit of {r['limit_bytes'] >> 20} MiB"]
    for x in r["runs"]:
        if "error" in x:
            lines.append(f"  {x['mode']}: FAILED ({x.get('returncode')}): {x['error']}")
            continue
        lines.append(f"  {x['mode']:>6}: {x['decode_tok_s']:.2f} tok/s over {len(x['tokens']) - 1} decode steps; peak "
                     f"RSS {x['self_peak_rss_kib'] / 1024:.0f} MiB, cgroup peak {x['cgroup_peak_bytes'] >> 20} MiB "
                     f"(limit {r['limit_bytes'] >> 20}), failcnt {x['cgroup_failcnt']}")
        if x.get("stats"):
            s = x["stats"]
            lines.append(f"          {x['memory']}\n          device hits {100 * s['device_hit_rate']:.1f}%, host "
                         f"hits {s['host_hits']}, disk reads {s['disk_reads']} + {s['prefetch_disk_reads']} "
                         f"prefetched ({s['bytes_disk'] / 2**20:.0f} MiB), waited {s['wait_s']:.2f} s; prefetch "
                         f"precision {s['precision'] or 0:.2f} recall {s['recall'] or 0:.2f}")
    if "pager" in r:
        from strata.commands.bench import format_pager

        lines.append(format_pager(r["pager"]))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
