"""Options every model-running command shares, and loading a model from them."""
from __future__ import annotations

import argparse


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF model file")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--dtype", default=None, help="compute dtype: float32, bfloat16, float16 "
                                                 "(default float32 on cpu, bfloat16 on cuda)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all available)")
    p.add_argument("--ctx", type=int, default=None, help="context length (default: min(model's, 4096))")


def add_sampling_args(p: argparse.ArgumentParser, temperature: float) -> None:
    p.add_argument("-n", "--max-tokens", type=int, default=256, help="tokens to generate at most (default 256)")
    p.add_argument("--temperature", type=float, default=temperature, help=f"0 = greedy (default {temperature})")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (1 = off)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the top probability")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="repetition penalty (1 = off)")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")


def sampling_kwargs(args: argparse.Namespace) -> dict:
    return dict(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                min_p=args.min_p, repetition_penalty=args.repeat_penalty, seed=args.seed, stop=args.stop or None)


def load_model(args: argparse.Namespace, max_batch: int = 1):
    import strata

    return strata.load(args.model, device=args.device, dtype=args.dtype, threads=args.threads, n_ctx=args.ctx,
                       max_batch=max_batch)
