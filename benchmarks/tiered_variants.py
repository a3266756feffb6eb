"""Benchmark: one file, the same budgets, several `strata.load` variants side by side (e.g. the
prefetch depth): decode tok/s after a warm-up, expert bytes read from disk per token, waits and
the time split of each.

    python benchmarks/tiered_variants.py FILE '[{}, {"prefetch_depth": 0}]' [--device-mem 820M]
        [--host-mem 360M] [--warmup 8] [-n 24] [--threads 2]

Each variant loads the model afresh and decodes an 8-token prompt greedily. Runs one after the
other in this process: compare figures of one run only. Not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import time

import strata


def run(path: str, variant: dict, a: argparse.Namespace) -> str:
    kw = dict(device="cpu", threads=a.threads, n_ctx=256, max_batch=1, device_mem=a.device_mem,
              host_mem=a.host_mem, **variant)
    with strata.load(path, **kw) as m:
        stream = m.generate(list(range(10, 18)), max_tokens=1 + a.warmup + a.n, temperature=0, stream=True,
                            stop_token_ids=())
        seen, t0 = 0, time.perf_counter()
        for _ in stream:
            seen += 1
            if seen == 1 + a.warmup:
                m.memory_stats().reset()
                m.reset_time_split()
                t0 = time.perf_counter()
        n, dt = seen - 1 - a.warmup, time.perf_counter() - t0
        st, sp = m.memory_stats().totals(), m.time_split()
        return (f"{json.dumps(variant)}: {n / dt:.2f} tok/s; disk {st['bytes_disk'] / n / 2**20:.1f} MiB/token; "
                f"per token ms: wait {1e3 * st['wait_s'] / n:.1f}, attention {1e3 * sp['attention']:.1f}, "
                f"experts {1e3 * sp['expert_compute']:.1f}, other {1e3 * sp['other']:.1f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("variants", help="JSON list of dicts of strata.load keyword arguments")
    p.add_argument("--device-mem", default="820M")
    p.add_argument("--host-mem", default="360M")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("-n", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    for variant in json.loads(a.variants):
        print(run(a.file, variant, a), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
