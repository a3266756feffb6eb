"""Benchmark (issue 28, point 3): which misses a stand-in memory should still read, replayed on a trace.

    python benchmarks/standin_admission.py [--trace flame_moe_290m_layers2-9_2048tok.npz] [--slots 8 16 32]
        [--margins 1 2 4] [--json]

With miss stand-ins every miss is computed at once, so reading the missed expert is a choice: it
costs disk bytes and buys later hits (fewer uses served by the low-bit copy). The engine's policy
(`ExpertPolicy`: decayed use counts, per-layer slots) replays the trace's routing (shared/traces/, or
`--save-trace` files) step by step; each miss is read (instantly, as in `strata bench cache`) when
  always:    every miss, evicting the least valuable expert (the paged memory without stand-ins,
             and background mode before admission);
  margin m:  a free slot, or over an expert whose keep value is below the miss's own use rate / m
             (`ExpertPolicy.admit_over`; background mode is m = 1);
  free only: a free slot (instead mode: the slots fill once, then stay).
Reports reads per token (experts, all layers) and the hit rate (uses served by the full expert).
Not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from strata.bench.traces import find_trace  # noqa: E402
from strata.memory.policy import ExpertPolicy, PolicyConfig  # noqa: E402
from strata.memory.trace import load_trace  # noqa: E402


def replay(indices: np.ndarray, n_experts: int, slots: int, margin: float | None) -> dict:
    """margin None: read every miss; 0: free slots only; m > 0: over keep values below rate / m."""
    L, T, K = indices.shape
    policy = ExpertPolicy(L, n_experts, slots, top_k=K, config=PolicyConfig())
    reads = hits = 0
    for t in range(T):
        for layer in range(L):
            ids = indices[layer, t]
            policy.record(layer, ids)
            rates = policy.use_rate(layer)
            for e in map(int, ids):
                if policy.lookup(layer, e) is not None:
                    hits += 1
                    continue
                value = np.inf if margin is None else 0.0 if margin == 0 else rates[e] / margin
                if policy.admit_over(layer, e, value) is not None:
                    policy.complete(layer, e)
                    reads += 1
    return {"reads_per_token": reads / T, "hit_rate": hits / (T * L * K)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="flame_moe_290m_layers2-9_2048tok.npz", help="a trace name or file")
    p.add_argument("--experts", type=int, default=None, help="experts per layer (default: the trace's largest id + 1)")
    p.add_argument("--slots", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--margins", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    path = Path(a.trace) if Path(a.trace).is_file() else find_trace(a.trace)
    if path is None:
        raise SystemExit(f"{a.trace}: no such trace (shared/traces/ or $STRATA_TRACE)")
    indices = np.asarray(load_trace(path))
    n_experts = a.experts or int(indices.max()) + 1
    rows = []
    for slots in a.slots:
        for name, margin in [("always", None), *((f"margin {m:g}", m) for m in a.margins), ("free only", 0)]:
            rows.append({"slots": slots, "rule": name, **replay(indices, n_experts, slots, margin)})
    if a.json:
        print(json.dumps({"trace": str(path), "n_experts": n_experts, "rows": rows}))
        return 0
    L, T, K = indices.shape
    print(f"{path.name}: {L} layers x {T} tokens, top-{K} of {n_experts}")
    print("| slots | rule | reads per token | hit rate |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['slots']} | {r['rule']} | {r['reads_per_token']:.2f} | {r['hit_rate']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
