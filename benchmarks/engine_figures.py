"""Figures for the decode engine (not a test): per architecture and file type, Strata's logits
against transformers' and llama.cpp's, top-1 agreement with llama.cpp, perplexities; then decode
speed on the `strata demo` model.

    PYTHONPATH=. python benchmarks/engine_figures.py [--device cuda]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import strata
from strata.engine.perplexity import perplexity
from tests.engine.test_llama_cpp import LlamaCpp
from tests.fixtures.tiny import ARCH_KEYS, zoo


def interop() -> None:
    for key in ARCH_KEYS:
        tiny = zoo().get(key)
        for outtype in ("f32", "q8_0", None):
            path = tiny.gguf(outtype)
            ref, ours = LlamaCpp(path), strata.load(path, threads=1, n_ctx=256, max_batch=1)
            ids = tiny.prompt_ids(96)
            a, b, hf = ref.logits(ids), ours.logits(ids), tiny.hf_logits(ids)
            top1 = float((a.argmax(-1) == b.argmax(-1)).float().mean())
            text = tiny.prompt_ids(192, seed=8)
            ppl_ref, ppl_ours = perplexity(ref.logits, text, 64, None).ppl, ours.perplexity(text, n_ctx=64).ppl
            rel_hf = float((hf - b).abs().max() / hf.abs().max())
            print(f"{key:9s} {outtype or 'default':7s} |strata-hf|/max {rel_hf:.1e}"
                  f"  |strata-llama.cpp|/max {float((a - b).abs().max() / b.abs().max()):.1e}  top-1 {top1:.3f}"
                  f"  ppl llama.cpp {ppl_ref:.1f} strata {ppl_ours:.1f} ({ppl_ours / ppl_ref - 1:+.2%})")
            ref.close()


def speed(device: str) -> None:
    from strata.commands.demo import run_demo as run

    result = run(tempfile.mkdtemp(prefix="strata-speed-"), device=device, say=lambda s: None)
    m = strata.load(Path(result["gguf"]), device=device, n_ctx=512)
    m.generate("the expert router", max_tokens=16, temperature=0)  # warm-up
    best = max(m.generate("the expert router", max_tokens=64, temperature=0, stop_token_ids=()).tokens_per_second
               for _ in range(3))
    print(f"demo model on {device} ({m.dtype}, {m.n_threads} threads): decode {best:.0f} tok/s")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.set_num_threads(1)
    interop()
    speed(args.device)
