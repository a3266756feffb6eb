"""Time the miss stand-ins' build at load (strata.memory.standin.StandIns) on one synthetic file.

    python benchmarks/standin_build.py [--layers 2 --experts 8 --hidden 1024 --ff 512] [--threads 1]

Writes a Q4_K qwen3moe file with strata.synth (once, under --dir), then builds its Q2_K stand-ins
and prints the seconds and the rate in weights per second. Run it before and after a change to
the quantizer with the same arguments.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from strata.gguf import PARTS, open_model
from strata.memory.standin import StandIns
from strata.synth.gguf_file import Shape, write


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ff", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--type", default="q2_k")
    p.add_argument("--dir", default="/tmp/strata-standin-bench")
    a = p.parse_args()
    shape = Shape(n_layers=a.layers, n_experts=a.experts, hidden=a.hidden, ff=a.ff, vocab=512)
    path = Path(a.dir) / f"l{a.layers}-e{a.experts}-h{a.hidden}-f{a.ff}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path, shape, drop_cache=False)
    with open_model(path) as mf:
        n_weights = sum(mf.hparams.n_experts * mf.expert(layer, 0, part).shape[0] * mf.expert(layer, 0, part).shape[1]
                        for layer in mf.expert_layers for part in PARTS)
        start = time.perf_counter()
        stand_ins = StandIns(mf, a.type, mf.expert_layers, a.threads)
        seconds = time.perf_counter() - start
    print(f"{path.name}: {n_weights / 1e6:.1f}M weights -> {stand_ins!r} in {seconds:.2f} s "
          f"({n_weights / seconds / 1e6:.1f}M weights/s, {a.threads} threads)")


if __name__ == "__main__":
    main()
