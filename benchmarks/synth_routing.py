"""Routing of `strata synth` files next to a real model's trace (not a test).

    python benchmarks/synth_routing.py [--tokens 1024] [--skew 0.5] [--layer-corr 0.9] [--trace T.npz]

Writes a synthetic file shaped like the real trace's model (8 MoE layers, 64 experts, top-6;
hidden 512, expert FFN 256), decodes `--tokens` tokens from it (temperature 1, no stop token)
while recording which experts every layer chose, saves that as a trace in the real trace's
format, and prints for both: the share of routing that goes to the hottest eighth of the experts,
token-to-token reuse within a layer, the co-occurrence predictor's next-layer recall, and the
replayed hit rates of LRU, the best fixed hot set and Belady's optimal at 8, 16 and 32 of 64 slots
(`strata bench cache`). The real trace: ../shared/traces (FLAME-MoE-290M, 2048 tokens).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from strata.bench.traces import find_trace  # noqa: E402

TRACE_NAME = "flame_moe_290m_layers2-9_2048tok.npz"
REAL = find_trace(TRACE_NAME) or ROOT.parent / "shared" / "traces" / TRACE_NAME


def capture(path: Path, tokens: int, seed: int) -> np.ndarray:
    """indices [L, T, K] of a greedy-free (temperature 1) decode of `tokens` tokens."""
    import strata

    with strata.load(path, threads=2, n_ctx=tokens + 16, memory="direct") as m:
        rows: dict[int, list[np.ndarray]] = {}
        observe = m.memory.observe

        def record(layer, ids):
            if ids.shape[0] == 1:  # decode steps only
                rows.setdefault(layer, []).append(ids[0].numpy().copy())
            return observe(layer, ids)

        m.memory.observe = record
        m.generate([1, 2, 3, 4], max_tokens=tokens + 1, temperature=1.0, top_k=0, seed=seed,
                   stop_token_ids=())
    return np.stack([np.stack(rows[layer]) for layer in sorted(rows)]).astype(np.int16)  # [L, T, K]


def figures(indices: np.ndarray, path: str) -> dict:
    from strata.bench.cache import bench_cache

    L, T, K = indices.shape
    E = int(indices.max()) + 1
    top = [np.sort(np.bincount(indices[layer].ravel(), minlength=E))[::-1][:E // 8].sum() / (T * K) for layer in range(L)]
    reuse = [np.mean([len(set(indices[layer, t]) & set(indices[layer, t + 1])) / K for t in range(T - 1)])
             for layer in range(L)]
    cache = bench_cache(path, [8, 16, 32], prefetch_depth=1)
    return {"experts": E, "k": K, "layers": L, "tokens": T, "hot_eighth_share": float(np.mean(top)),
            "reuse": float(np.mean(reuse)), "next_layer_recall": cache["predictor_recall"][0],
            "hit": {n: {c: row[c]["hit_rate"] for c in ("lru", "fixed", "belady", "policy")}
                    for n, row in cache["slots"].items()}}


def main() -> int:
    from strata.synth.gguf_file import ROUTER_SKEW, Shape, write

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--skew", type=float, default=ROUTER_SKEW)
    p.add_argument("--layer-corr", type=float, default=0.85)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", type=Path, default=REAL)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        gguf = Path(tmp) / "synth.gguf"
        write(gguf, Shape(n_layers=8, n_experts=64, top_k=6, hidden=512, ff=256, n_head=4, n_head_kv=1,
                          weight_scale=0.3, skew=a.skew, layer_corr=a.layer_corr, seed=a.seed), drop_cache=False)
        trace = Path(tmp) / "synth_trace.npz"
        np.savez(trace, indices=capture(gguf, a.tokens, a.seed))
        rows = {"synthetic": figures(np.load(trace)["indices"], str(trace))}
    if a.trace.exists():
        rows["real trace"] = figures(np.load(a.trace)["indices"], str(a.trace))
    print(f"skew {a.skew:g}, layer correlation {a.layer_corr:g}")
    print(f"{'':12}{'hot 1/8 share':>14}{'reuse':>8}{'next-layer recall':>19}   hit rate LRU / fixed / Belady / policy "
          "at 8, 16, 32 of 64")
    for name, f in rows.items():
        hits = "   ".join(" / ".join(f"{h[c]:.3f}" for c in ("lru", "fixed", "belady", "policy"))
                           for h in f["hit"].values())
        print(f"{name:12}{f['hot_eighth_share']:>14.3f}{f['reuse']:>8.3f}{f['next_layer_recall']:>19.3f}   {hits}")
    print(f"chance: hot share {1 / 8:.3f}, reuse and recall {6 / 64:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
