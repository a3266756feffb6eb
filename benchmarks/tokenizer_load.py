"""Time to build a file's tokenizer from its metadata (`Tokenizer.from_metadata`), the part of every
load that grows with the vocabulary (not a test).

    python benchmarks/tokenizer_load.py [--vocab qwen35 llama-bpe ...] [--synthetic 150000] [--repeat 3]

Vocabularies: llama.cpp's test vocabularies (`models/ggml-vocab-NAME.gguf` under
$STRATA_LLAMA_CPP_SRC: qwen35 and qwen2 hold ~152k tokens, llama-bpe 128k, gemma-4 262k) and a
synthetic byte-level BPE vocabulary of N tokens (each new token merges two earlier ones). Prints
the best of `--repeat` builds per vocabulary, wall and CPU time. Figures vary with machine load.
"""
from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

from strata.gguf.header import scan_header
from strata.tokenizer import Tokenizer, bytes_to_unicode


def synthetic_metadata(n_tokens: int, seed: int = 0) -> dict:
    """A byte-level BPE vocabulary of `n_tokens`: the 256 byte characters, then merges of two
    earlier tokens into a new one, until there are `n_tokens`."""
    rng = random.Random(seed)
    tokens = list(bytes_to_unicode().values())
    known, merges = set(tokens), []
    while len(tokens) < n_tokens:
        left, right = tokens[rng.randrange(len(tokens))], tokens[rng.randrange(min(len(tokens), 4096))]
        if left + right not in known and len(left + right) <= 16:
            known.add(left + right)
            tokens.append(left + right)
            merges.append(f"{left} {right}")
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [1] * len(tokens), "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.eos_token_id": len(tokens) - 1}


def best_seconds(metadata: dict, name: str, repeat: int) -> tuple[float, float]:
    """(best wall time, best CPU time of this process) of `repeat` builds: on a shared machine the
    CPU time says what the build costs, the wall time what a user waits."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        Tokenizer.from_metadata(metadata, name)
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return wall, cpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", nargs="*", default=["qwen35", "llama-bpe"])
    p.add_argument("--synthetic", type=int, default=150_000, help="tokens of the synthetic vocabulary (0: none)")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    src = os.environ.get("STRATA_LLAMA_CPP_SRC")
    for name in a.vocab if src else []:
        path = Path(src) / "models" / f"ggml-vocab-{name}.gguf"
        meta = scan_header(path).metadata
        n_tokens, n_merges = len(meta["tokenizer.ggml.tokens"]), len(meta.get("tokenizer.ggml.merges", []))
        wall, cpu = best_seconds(meta, str(path), a.repeat)
        print(f"{name:>12}: {n_tokens:>7} tokens, {n_merges:>7} merges: {wall:.2f} s ({cpu:.2f} s CPU)")
    if a.synthetic:
        meta = synthetic_metadata(a.synthetic)
        wall, cpu = best_seconds(meta, "synthetic", a.repeat)
        print(f"{'synthetic':>12}: {a.synthetic:>7} tokens, {len(meta['tokenizer.ggml.merges']):>7} merges: "
              f"{wall:.2f} s ({cpu:.2f} s CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
