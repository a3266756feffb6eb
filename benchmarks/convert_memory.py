"""Benchmark: convert a synthetic checkpoint ~3x larger than the memory the converter may use.

    python benchmarks/convert_memory.py [--limit-mb 512] [--factor 3] [--mode cgroup|rlimit|both]

Writes a Qwen3-MoE-shaped bfloat16 checkpoint of about factor x limit bytes, then runs
`python -m strata.convert` on it (default types: Q8_0 attention, Q4_K experts) in a child process
confined either by a memory cgroup (v1, needs root: page cache counts against the limit, as on a
real machine under pressure) or by RLIMIT_AS (address space: a converter that memory-mapped or
loaded the checkpoint would fail). Reports the child's peak RSS, the cgroup's peak usage, wall
time and MB/s of input, and checks the output with gguf-py. Not a unit test.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from strata.synth import write_checkpoint  # noqa: E402

CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def make_checkpoint(folder: Path, target_bytes: int) -> int:
    """Layers of 32 experts (hidden 2048, expert width 768: ~302 MB of bf16 each) up to the target."""
    per_layer = 32 * 3 * 768 * 2048 * 2
    n_layers = max(1, round(target_bytes / per_layer))
    return write_checkpoint(folder, hidden=2048, n_layers=n_layers, n_experts=32, moe_ff=768)


def _cgroup(limit: int) -> Path:
    group = CGROUP_V1 / f"strata-convert-bench-{os.getpid()}"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(limit))
    return group


def run_converter(ckpt: Path, out: Path, limit: int, mode: str, threads: int | None) -> dict:
    cmd = [sys.executable, "-m", "strata.convert", str(ckpt), "-o", str(out), "--no-progress"]
    if threads:
        cmd += ["--threads", str(threads)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    group = _cgroup(limit) if mode == "cgroup" else None

    def confine():
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        else:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, preexec_fn=confine, stdout=subprocess.DEVNULL, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read()
    result = {"mode": mode, "limit_bytes": limit, "returncode": proc.returncode, "wall_s": round(wall, 2),
              "peak_rss_bytes": usage.ru_maxrss * 1024,
              "stderr_tail": stderr.strip().splitlines()[-1:] if proc.returncode else []}
    if group is not None:
        result["cgroup_peak_bytes"] = int((group / "memory.max_usage_in_bytes").read_text())
        result["cgroup_failcnt"] = int((group / "memory.failcnt").read_text())
        group.rmdir()
    return result


def check_output(out: Path) -> dict:
    import gguf
    reader = gguf.GGUFReader(out)
    types: dict[str, int] = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + int(t.n_bytes)
    return {"tensors": len(reader.tensors), "bytes_by_type": types, "file_bytes": out.stat().st_size}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit-mb", type=int, default=512)
    p.add_argument("--factor", type=float, default=3.0)
    p.add_argument("--mode", choices=("cgroup", "rlimit", "both"), default="both")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--workdir", default=None, help="where to put the checkpoint and output (default: a temp dir)")
    args = p.parse_args()

    limit = args.limit_mb << 20
    modes = ["cgroup", "rlimit"] if args.mode == "both" else [args.mode]
    if "cgroup" in modes and not os.access(CGROUP_V1, os.W_OK):
        print("memory cgroup v1 not writable here; using RLIMIT_AS only", file=sys.stderr)
        modes = ["rlimit"]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="strata-convert-bench-"))
    try:
        ckpt = work / "ckpt"
        t0 = time.perf_counter()
        src_bytes = make_checkpoint(ckpt, int(args.factor * limit))
        report = {"checkpoint_bytes": src_bytes, "checkpoint_to_limit": round(src_bytes / limit, 2),
                  "generate_s": round(time.perf_counter() - t0, 1), "runs": []}
        for mode in modes:
            out = work / f"out-{mode}.gguf"
            run = run_converter(ckpt, out, limit, mode, args.threads)
            if run["returncode"] == 0:
                run["input_MB_per_s"] = round(src_bytes / 1e6 / run["wall_s"], 1)
                run["output"] = check_output(out)
                out.unlink()
            report["runs"].append(run)
        print(json.dumps(report, indent=1))
        return 0 if all(r["returncode"] == 0 for r in report["runs"]) else 1
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
