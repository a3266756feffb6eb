"""Benchmark: peak memory of a calibrated conversion (--calib) does not grow with the model's depth.

    PYTHONPATH=$PWD python benchmarks/calib_memory.py [--layers 2 6] [--hidden 1024] [--experts 16]
        [--limit-mib N]

Writes synthetic Qwen3-MoE-shaped bfloat16 checkpoints (strata.synth.write_checkpoint) that differ
only in their number of layers, runs `python -m strata.convert --calib` on each in a child process
and reports its peak RSS next to the size of one layer in float32 (what the calibration holds: one
layer's weights, its matrices' Hessians, the calibration tokens' hidden states) and of the whole
model. Bounded memory means the peak stays flat as layers are added. With --limit-mib each run is
confined to a v1 memory cgroup of that size (page cache counted; needs root), so a checkpoint
larger than the limit must calibrate inside it: the cgroup's peak and failcnt are reported too.
Not a unit test.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from strata.synth import write_checkpoint  # noqa: E402
from strata.synth.tokenizer import corpus  # noqa: E402

_CHILD = """
import resource, sys
sys.path.insert(0, {root!r})
from strata.commands.convert import main
rc = main(sys.argv[1:])
print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(rc)
"""


def run(ckpt: Path, out: Path, text: Path, tokens: int, limit_mib: int | None = None) -> dict:
    args = [sys.executable, "-c", _CHILD.format(root=str(ROOT)), str(ckpt), "-o", str(out), "--calib", str(text),
            "--calib-tokens", str(tokens), "--calib-ctx", "256", "--no-progress"]
    t0, group, extra = time.time(), None, {}
    if limit_mib:
        from benchmarks.tiered_cgroup import _cgroup
        group = _cgroup(limit_mib << 20)
    try:
        p = subprocess.run(args, capture_output=True, text=True, preexec_fn=None if group is None else
                           lambda: (group / "cgroup.procs").write_text(str(__import__("os").getpid())))
        if group is not None:
            extra = {"limit_bytes": limit_mib << 20,
                     "cgroup_peak_bytes": int((group / "memory.max_usage_in_bytes").read_text()),
                     "cgroup_failcnt": int((group / "memory.failcnt").read_text())}
    finally:
        if group is not None:
            group.rmdir()
    if p.returncode:
        raise SystemExit(f"convert --calib failed ({p.returncode}; {extra}): {p.stderr[-2000:]}")
    peak = int(next(line.split()[1] for line in p.stdout.splitlines() if line.startswith("PEAK_KB"))) * 1024
    return {"peak_rss": peak, "seconds": time.time() - t0, "out_bytes": out.stat().st_size, **extra}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 6])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--moe-ff", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--limit-mib", type=int, default=None, help="run each conversion in a memory cgroup")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="strata-calib-mem-") as tmp:
        text = Path(tmp) / "calib.txt"
        text.write_text(" ".join(corpus(4000, seed=1)))
        for n in args.layers:
            ckpt = Path(tmp) / f"ckpt{n}"
            total_bf16 = write_checkpoint(ckpt, hidden=args.hidden, n_layers=n, n_experts=args.experts,
                                          moe_ff=args.moe_ff)
            layer_f32 = 4 * (3 * args.experts * args.moe_ff * args.hidden + 4 * args.hidden * args.hidden)
            r = run(ckpt, Path(tmp) / f"out{n}.gguf", text, args.tokens, args.limit_mib)
            r.update(layers=n, model_f32=2 * total_bf16, layer_f32=layer_f32,
                     hidden_states=4 * args.tokens * args.hidden)
            rows.append(r)
            print(f"{n:3d} layers: model {r['model_f32'] / 2**20:7.1f} MiB f32, one layer {layer_f32 / 2**20:6.1f} MiB; "
                  f"peak RSS {r['peak_rss'] / 2**20:7.1f} MiB; {r['seconds']:.0f} s"
                  + (f"; cgroup {args.limit_mib} MiB: peak {r['cgroup_peak_bytes'] / 2**20:.0f} MiB, failcnt "
                     f"{r['cgroup_failcnt']}" if args.limit_mib else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
