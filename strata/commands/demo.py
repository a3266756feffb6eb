"""`strata demo`: the whole path on a fresh machine, in seconds, with nothing downloaded.

1. builds a tiny random Qwen3-MoE checkpoint in Hugging Face's layout (`strata.synth`: config.json,
   model.safetensors, a byte-level BPE tokenizer trained on the spot with a ChatML template);
2. converts it with `strata.convert` (attention Q8_0, experts Q4_K);
3. loads the GGUF file and generates a short continuation;
4. runs one scripted chat turn through the chat template.

The weights are random, so the text is gibberish; the point is that every step runs. This module
only sequences and reports the steps; the builder, converter and engine do the work.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Callable

from strata.units import format_bytes


def run_demo(workdir: str | None = None, device: str = "cpu", threads: int | None = None,
             say: Callable[[str], None] = print) -> dict:
    """Run the four steps, reporting each with `say`; returns what each step produced."""
    from converters import TypePolicy, convert

    import strata
    from strata.synth import build_checkpoint

    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="strata-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    hf_dir = build_checkpoint(root / "checkpoint", readable=True)
    files = ", ".join(sorted(p.name for p in hf_dir.iterdir()))
    say(f"[1/4] tiny random MoE checkpoint -> {hf_dir} ({files})")
    gguf_path = root / "demo-q8_0-q4_k.gguf"
    convert(hf_dir, gguf_path, TypePolicy(), name="strata-demo", n_threads=threads)
    say(f"[2/4] converted with strata.convert -> {gguf_path} ({format_bytes(gguf_path.stat().st_size)}; attention Q8_0, experts Q4_K)")
    model = strata.load(gguf_path, device=device, threads=threads, n_ctx=512)
    prompt = "the expert router"
    done = model.generate(prompt, max_tokens=24, temperature=0.0)
    say(f"[3/4] generate: {prompt!r} -> {done.text!r} ({len(done.token_ids)} tokens, "
        f"{done.tokens_per_second:.1f} tok/s, {model.device})")
    messages = [{"role": "system", "content": "You are a demo."}, {"role": "user", "content": "Where do experts live?"}]
    reply = model.chat(messages, max_tokens=24, temperature=0.8, seed=1)
    say(f"[4/4] chat: user {messages[1]['content']!r} -> assistant {reply.text!r} "
        f"({len(reply.token_ids)} tokens, {reply.finish_reason})")
    say(f"done: files are in {root} (random weights, so the words are random too). "
        f"Next: strata chat {gguf_path}")
    model.close()
    return {"root": root, "checkpoint": hf_dir, "gguf": gguf_path, "generate": done, "chat": reply}


def run(args: argparse.Namespace) -> int:
    run_demo(args.dir, device=args.device, threads=args.threads)
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("demo", help="build, convert and run a tiny random MoE model (no downloads)")
    p.add_argument("--dir", default=None, help="folder for the demo's files (default: a new temporary folder)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all available)")
    p.set_defaults(func=run)
