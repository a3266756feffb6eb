"""Per-token cost of the grammar mask (strata.engine.grammar, llguidance): fill one sequence's
bitmask and apply it to a [V] row of logits, along random walks through a strict JSON schema.

Vocabularies: the tiny trained byte-level BPE of the test fixtures (600 tokens) and, when
llama.cpp's source is here (STRATA_LLAMA_CPP_SRC), Qwen2's (models/ggml-vocab-qwen2.gguf, 151,936).

    PYTHONPATH=. python benchmarks/grammar_mask.py [--tokens 400]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from strata.engine.grammar import Grammar, Matcher, apply_masks, vocabulary

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16}, "kind": {"enum": ["cat", "dog", "bird"]},
    "grid": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 4}, "maxItems": 4},
    "ok": {"type": "boolean"}}, "required": ["name", "kind", "grid", "ok"], "additionalProperties": False}


def tokenizers() -> list[tuple[str, object, list[int]]]:
    from strata.engine.api import load
    from tests.fixtures.tiny import zoo

    with load(zoo().get("qwen3moe").gguf("f32"), threads=1) as m:
        out = [("tiny BPE", m.tokenizer, sorted(m.stop_token_ids))]
    src = os.environ.get("STRATA_LLAMA_CPP_SRC")
    path = Path(src or "") / "models/ggml-vocab-qwen2.gguf"
    if src and path.exists():
        from strata.gguf.header import scan_header
        from strata.tokenizer import Tokenizer

        tok = Tokenizer.from_metadata(scan_header(path).metadata, str(path))
        out.append(("Qwen2 vocab", tok, sorted(tok.eog_ids)))
    return out


def walk(tok, eos: list[int], n_tokens: int, seed: int) -> tuple[list[float], list[float]]:
    """Seconds per token to fill the mask, and to apply it, along one random walk (restarted when done)."""
    vocab = vocabulary(tok, eos)
    grammar = Grammar.json_schema(SCHEMA)
    gen = torch.Generator().manual_seed(seed)
    matcher, fill, apply = Matcher(grammar, vocab), [], []
    from llguidance.torch import allocate_token_bitmask, fill_next_token_bitmask

    bits = allocate_token_bitmask(1, tok.vocab_size)
    for _ in range(n_tokens):
        logits = torch.randn(1, tok.vocab_size, generator=gen)
        t0 = time.perf_counter()
        fill_next_token_bitmask(matcher.ll, bits, 0)
        t1 = time.perf_counter()
        apply_masks(logits, [0], [matcher])  # fills again, then expands and applies
        t2 = time.perf_counter()
        fill.append(t1 - t0)
        apply.append((t2 - t1) - (t1 - t0))
        token = int(torch.multinomial(logits.softmax(-1), 1, generator=gen))
        matcher.advance(token)
        if matcher.ended:
            matcher = Matcher(grammar, vocab)
    return fill, apply


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=400)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name, tok, eos in tokenizers():
        t0 = time.perf_counter()
        vocabulary(tok, eos)
        build = time.perf_counter() - t0
        fill, apply = walk(tok, eos, args.tokens, 0)
        ms = lambda xs: 1e3 * statistics.median(xs)  # noqa: E731
        print(f"{name:12s} V={tok.vocab_size:7d}  vocabulary built in {build:.2f} s  mask fill {ms(fill):.3f} ms "
              f"(p90 {1e3 * sorted(fill)[int(0.9 * len(fill))]:.3f})  apply {ms(apply):.3f} ms per token")


if __name__ == "__main__":
    main()
