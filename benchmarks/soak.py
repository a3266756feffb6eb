"""A soak run (not a test): thousands of decoded tokens through one model, tokens/s and memory over
time, to show that speed stays flat (no cache-policy collapse) and memory does not grow.

    python benchmarks/soak.py MODEL.gguf [--tokens 2000] [--window 100] [--device-mem 2G --host-mem 3G]
                              [--temperature 1.0] [--json OUT.json] [--png OUT.png]

One sequence decodes `--tokens` tokens (sampled, so the text and its routing keep changing; no stop
token); every `--window` tokens it records the window's tokens/s, the process's resident memory
and the expert memory's device hit rate over the window. Prints one row per window and the
summary: last-quarter over first-quarter speed (after the first window, which includes the
warm-up) and RSS growth. `--png` plots tokens/s and RSS against tokens (needs matplotlib).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) * 1024


def soak(path: str, tokens: int, window: int, temperature: float, **load_kwargs) -> dict:
    import strata

    with strata.load(path, max_batch=1, n_ctx=tokens + 16, **load_kwargs) as model:
        stats = model.memory_stats()
        rows, seen, t0 = [], 0, time.perf_counter()
        hits0 = reqs0 = 0
        stream = model.generate([1, 2, 3, 4], max_tokens=tokens, temperature=temperature, top_k=0, seed=0, stream=True,
                                stop_token_ids=())
        for _ in stream:
            seen += 1
            if seen % window == 0:
                now = time.perf_counter()
                t = stats.totals() if stats is not None else None
                hits, reqs = (t["device_hits"], t["requests"]) if t else (0, 0)
                rows.append({"tokens": seen, "tok_s": window / (now - t0), "rss_bytes": rss_bytes(),
                             "device_hit_rate": (hits - hits0) / (reqs - reqs0) if reqs > reqs0 else None})
                t0, hits0, reqs0 = now, hits, reqs
        memory = repr(model.memory)
    steady = rows[1:] or rows
    q = max(1, len(steady) // 4)
    first, last = statistics.fmean(r["tok_s"] for r in steady[:q]), statistics.fmean(r["tok_s"] for r in steady[-q:])
    return {"file": str(path), "memory": memory, "tokens": tokens, "window": window, "rows": rows,
            "last_over_first": last / first, "rss_growth_bytes": steady[-1]["rss_bytes"] - steady[0]["rss_bytes"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device-mem", default=None)
    p.add_argument("--host-mem", default=None)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--png", type=Path, default=None)
    a = p.parse_args()
    r = soak(a.model, a.tokens, a.window, a.temperature, threads=a.threads, device_mem=a.device_mem,
             host_mem=a.host_mem)
    print(f"{r['file']}: {r['memory']}")
    print(f"{'tokens':>7} {'tok/s':>8} {'RSS MiB':>8} {'device hit':>11}")
    for x in r["rows"]:
        hit = "-" if x["device_hit_rate"] is None else f"{x['device_hit_rate']:.3f}"
        print(f"{x['tokens']:>7} {x['tok_s']:>8.2f} {x['rss_bytes'] / 2**20:>8.0f} {hit:>11}")
    print(f"last quarter / first quarter tok/s (after the first window): {r['last_over_first']:.3f}; RSS growth "
          f"{r['rss_growth_bytes'] / 2**20:.1f} MiB")
    if a.json:
        a.json.write_text(json.dumps(r, indent=1))
    if a.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.5))
        xs = [x["tokens"] for x in r["rows"]]
        ax.plot(xs, [x["tok_s"] for x in r["rows"]], label="tokens/s")
        ax.set_xlabel("tokens decoded")
        ax.set_ylabel("tokens/s (per window)")
        ax2 = ax.twinx()
        ax2.plot(xs, [x["rss_bytes"] / 2**20 for x in r["rows"]], color="gray", linestyle="--", label="RSS")
        ax2.set_ylabel("RSS (MiB)")
        ax.set_title(Path(r["file"]).name)
        fig.tight_layout()
        fig.savefig(a.png, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
