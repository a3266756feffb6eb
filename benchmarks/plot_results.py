"""PNG plots of benchmarks/results/*.json for benchmarks/RESULTS.md (not a test; needs matplotlib).

    python benchmarks/plot_results.py      # writes benchmarks/results/{budget,ladder}.png

budget_*.json: `strata bench MODEL --json` at several --device-mem (decode tok/s and device hit
rate against the device budget); ladder.json: `strata bench ladder --json` (tokens/s per step).
The soak plot is written by benchmarks/soak.py itself.
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def budget_plot() -> None:
    runs = []
    for f in RESULTS.glob("budget_*.json"):
        size = f.stem.split("_", 1)[1]
        r = json.loads(f.read_text())
        x = r["tg"]["1"]
        runs.append((float(size[:-1]) * UNITS[size[-1]] / 2**20, x["tok_s"]["mean"], x["tiers"]["device_hit_rate"]))
    runs.sort()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r[0] for r in runs], [r[1] for r in runs], marker="o", label="decode tok/s")
    ax.set_xlabel("device budget (MiB)")
    ax.set_ylabel("decode tokens/s")
    ax2 = ax.twinx()
    ax2.plot([r[0] for r in runs], [r[2] for r in runs], marker="s", color="gray", linestyle="--")
    ax2.set_ylabel("device hit rate")
    ax.set_title("decode speed against the device budget")
    fig.tight_layout()
    fig.savefig(RESULTS / "budget.png", dpi=100)


def ladder_plot() -> None:
    r = json.loads((RESULTS / "ladder.json").read_text())
    names, rates = [x["name"] for x in r["rows"]], [x["tok_s"] for x in r["rows"]]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.barh(names[::-1], rates[::-1])
    for i, x in enumerate(r["rows"][::-1]):
        ax.text(x["tok_s"], i, f" {x['tok_s']:.1f} ({x['ratio']:.2f}x)", va="center")
    ax.set_xlabel("decode tokens/s")
    ax.set_title("the ablation ladder")
    fig.tight_layout()
    fig.savefig(RESULTS / "ladder.png", dpi=100)


if __name__ == "__main__":
    budget_plot()
    ladder_plot()
