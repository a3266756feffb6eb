"""Benchmark: the ablation ladder (`strata bench ladder`) inside a memory cgroup smaller than the
model file, the setting the tiers are for, on a cold copy of the file.

    python benchmarks/ladder_cgroup.py FILE [--ratio 3] [-n 8] [--batch 4] [--device-mem 820M]
        [--host-mem 360M] [--threads 2] [--json OUT.json]

Copies FILE with O_DIRECT (no page of the copy cached), makes a v1 memory cgroup of file / ratio
bytes (page cache counted; needs root), runs the ladder command in it and prints its table with
the cgroup's peak usage and failcnt. Every row of the ladder runs in the same process, one after
the other, so the rows after the first find what the earlier ones left in the page cache (within
the limit). Not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_files import cold_copy  # noqa: E402
from benchmarks.tiered_cgroup import CGROUP_V1, _cgroup  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file", type=Path)
    p.add_argument("--ratio", type=float, default=3.0)
    p.add_argument("-n", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--device-mem", default="820M")
    p.add_argument("--host-mem", default="360M")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="also write the report here")
    a = p.parse_args()
    if not os.access(CGROUP_V1, os.W_OK):
        raise SystemExit(f"{CGROUP_V1} is not writable (needs root and cgroup v1)")
    size = a.file.stat().st_size
    limit = int(size / a.ratio)
    cold = a.file.with_name(f"cold-ladder-{os.getpid()}-{a.file.name}")
    report = {"file": str(a.file), "file_bytes": size, "limit_bytes": limit}
    try:
        report["copy_s"] = cold_copy(a.file, cold)
        group = _cgroup(limit)
        try:
            argv = [sys.executable, "-m", "strata", "bench", "ladder", str(cold), "-n", str(a.n), "--batch",
                    str(a.batch), "--threads", str(a.threads), "--device-mem", a.device_mem, "--host-mem",
                    a.host_mem, "--json"]
            done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT,
                                  env=dict(os.environ, PYTHONPATH=str(ROOT)),
                                  preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
            report["cgroup_peak_bytes"] = int((group / "memory.max_usage_in_bytes").read_text())
            report["cgroup_failcnt"] = int((group / "memory.failcnt").read_text())
        finally:
            group.rmdir()
    finally:
        cold.unlink(missing_ok=True)
    if done.returncode != 0:
        raise SystemExit(f"the ladder failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    report["ladder"] = json.loads(done.stdout)
    if a.json:
        a.json.write_text(json.dumps(report, indent=2))
    print(f"{a.file}: {size / 1e9:.2f} GB as a cold copy, memory cgroup {limit / 2**30:.2f} GiB (file / {a.ratio}); "
          f"cgroup peak {report['cgroup_peak_bytes'] / 2**20:.0f} MiB, failcnt {report['cgroup_failcnt']}")
    for row in report["ladder"]["rows"]:
        print(f"  {row['name']:<32} batch {row['batch']:>2}  {row['tok_s']:8.2f} tok/s  {row['ratio']:6.2f}x naive  "
              f"({row['memory']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
