"""Precision per depth of the look-ahead, its learned correction, co-occurrence and their product,
on the hidden states of a synthetic preset (strata/bench/hidden_predict.py).

The preset's tiny file (`strata.bench.traces.preset_trace_shape`) at `--weight-scale` (the presets'
0.3 keeps the residual stream so still that the plain look-ahead is right 98-99% of the time up
to depth 3; 1.0 lets each layer move it as a real model's does), a random-token text read in
one prefill, then replayed token by token, online.

    PYTHONPATH=$PWD python benchmarks/predict_hidden.py --preset qwen3-235b-like --layers 6 --tokens 768 \
        --weight-scale 1.0 --ridge 0.3
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from strata.bench.hidden_predict import record_routes, replay  # noqa: E402
from strata.bench.traces import preset_trace_shape  # noqa: E402
from strata.synth.gguf_file import write  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="qwen3-235b-like")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--tokens", type=int, default=768)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--weight-scale", type=float, default=1.0)
    p.add_argument("--ridge", type=float, default=None)
    p.add_argument("--blend-weight", type=float, default=0.05)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "preset.gguf"
        shape = dataclasses.replace(preset_trace_shape(a.preset, a.layers), weight_scale=a.weight_scale)
        write(path, shape, drop_cache=False)
        routes = record_routes(path, a.tokens, a.depth)
    extra = {} if a.ridge is None else {"ridge": a.ridge}
    for name, rows in replay(routes, a.depth, a.blend_weight, **extra).items():
        print(f"{name:28s}", "  ".join(f"d{r['depth']} {r['precision']:.3f}/{r['recall']:.3f}" for r in rows))


if __name__ == "__main__":
    main()
