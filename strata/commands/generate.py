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
                return _run(args, model, ep)
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                return _run(args, model, ep)
    finally:
        if ep is not None:
            ep.close()


def _run(args: argparse.Namespace, model, ep=None) -> int:
    if args.json:
        done = model.generate(args.prompt)
        ranks = _ranks(args, model, ep, done)
        print(json.dumps({**done.to_dict(), "prompt_tokens": done.prompt_tokens, **({"ranks": ranks} if ranks else {})},
                         ensure_ascii=False))
        print_stats(args, model)
        _print_ranks(args, ranks)
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
    _print_ranks(args, _ranks(args, model, ep, done))
    save_routing(args, model)
    return 0


def _ranks(args: argparse.Namespace, model, ep, done) -> list[dict] | None:
    """Under expert parallelism with --stats or --json: every rank's figures since load (a collective:
    every rank calls it), else None."""
    if ep is None or not (args.json or args.stats):
        return None
    from strata.bench.expert_parallel import since_load

    return ep.gather(since_load(model, ep, done))


def _print_ranks(args: argparse.Namespace, ranks: list[dict] | None) -> None:
    """With --stats, one line per rank on stderr: decode rate, bytes per processed token from the
    disk and over the network, and the time split of its forward passes."""
    if not args.stats or not ranks:
        return
    for r in ranks:
        ms = r["ms_per_token"]
        print(f"rank {r['rank']}/{r['world_size']}: decode {r['tok_s']:.2f} tok/s; per processed token "
              f"({r['tokens']}): disk {r['disk_bytes_per_token'] / 1024:.1f} KiB, "
              f"{'shared memory' if r['shared_share'] == 1 else 'network'} "
              f"{r['net_bytes_sent_per_token'] / 1024:.1f} KiB sent + {r['net_bytes_received_per_token'] / 1024:.1f} "
              f"KiB received, time (ms): compute {ms['compute']:.2f}, "
              f"disk wait {ms['disk_wait']:.2f}, collective {ms['collective']:.2f}", file=sys.stderr)


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
