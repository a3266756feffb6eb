"""`strata generate MODEL -p TEXT`: continue a prompt, streaming the text (or one JSON object).
Must not: hold generation logic; it parses arguments and calls `strata.load(...).generate`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from .common import (add_expert_parallel_args, add_model_args, add_sampling_args, add_save_routing_arg,
                     expert_parallel, load_model, print_stats, save_routing)


def run(args: argparse.Namespace) -> int:
    ep = expert_parallel(args)  # None, or this rank of the group (every rank runs the same generation)
    try:
        with load_model(args, ep=ep) as model:  # its default SamplingParams are the flags'; closed on every path
            if ep is None or ep.rank == 0:
                return _run(args, model)
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                return _run(args, model)
    finally:
        if ep is not None:
            ep.close()


def _run(args: argparse.Namespace, model) -> int:
    if args.json:
        done = model.generate(args.prompt)
        print(json.dumps({**done.to_dict(), "prompt_tokens": done.prompt_tokens}, ensure_ascii=False))
        print_stats(args, model)
        save_routing(args, model)
        return 0
    stream = model.generate(args.prompt, stream=True)
    sys.stdout.write(args.prompt)
    for chunk in stream:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
    done = stream.completion
    print()
    print(f"[{len(done.token_ids)} tokens, {done.tokens_per_second:.1f} tok/s, prompt {done.prompt_tokens} tokens "
          f"in {done.prefill_seconds:.2f} s, finish: {done.finish_reason}]", file=sys.stderr)
    print_stats(args, model)
    save_routing(args, model)
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="continue a prompt")
    add_model_args(p)
    p.add_argument("-p", "--prompt", required=True, help="prompt text")
    add_sampling_args(p)
    p.add_argument("--ignore-eos", action="store_true",
                   help="do not stop at the end-of-sequence token: generate exactly -n tokens (stop strings still apply)")
    p.add_argument("--json", action="store_true",
                   help='print {"token_ids": [...], "text": ..., "tokens_per_second": ...} and nothing else')
    add_save_routing_arg(p)
    add_expert_parallel_args(p)
    p.set_defaults(func=run)
