"""KL divergence to the float32 model on held-out text: round-to-nearest vs --imatrix vs --calib (GPTQ).

For each tiny fixture architecture (tests/convert/fixtures.py: transformers' own classes, random
weights), with outlier channels added to the norms (`sharpen`: real models' activations have a few
channels far larger than the rest; random ones do not, and importance then carries no signal):
  * F32 file -> reference logits on held-out text (corpus seed 2);
  * RTN:     default types (Q8_0 attention, Q4_K experts);
  * imatrix: `strata imatrix F32.gguf -f CALIB` (Strata's writer, llama.cpp's format), then --imatrix;
  * GPTQ:    --calib CALIB (corpus seed 1: different documents from the held-out text).
Engine logits in float compute (weights dequantized, so the error measured is the weights').

    PYTHONPATH=$PWD python benchmarks/calib_kld.py [--archs mixtral qwen2moe ...] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.calib.kld import ARCHS, kld_table  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", nargs="*", default=list(ARCHS))
    ap.add_argument("--calib-tokens", type=int, default=4096)
    ap.add_argument("--heldout-tokens", type=int, default=2048)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="strata-calib-") as tmp:
        rows = kld_table(Path(tmp), args.archs, args.calib_tokens, args.heldout_tokens)
    print(f"{'arch':10} {'method':8} {'KLD mean':>10} {'vs RTN':>8} {'top-1':>7} {'MiB':>6}")
    for r in rows:
        print(f"{r['arch']:10} {r['method']:8} {r['kl_mean']:10.5f} {r['vs_rtn']:8.1%} {r['top1']:7.2%} "
              f"{r['bytes'] / 2**20:6.2f}")
    print(f"({time.time() - t0:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
