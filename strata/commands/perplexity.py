"""`strata perplexity MODEL -f TEXT_FILE`: perplexity as llama.cpp's tool computes it; with
--save-logits / --kl-divergence BASE, two files of one model compare by KL and top-1 agreement.

Must not compute: the maths is `strata.engine.perplexity`'s; this module parses, calls, prints.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from strata.errors import StrataError

from .common import add_model_args, add_save_routing_arg, load_model, print_stats, save_routing


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise StrataError(f"{path}: cannot read the text file: {exc}") from None


def run(args: argparse.Namespace) -> int:
    import torch

    from strata.engine import compare_logits

    model = load_model(args)
    tokens = model.tokenize(_read_text(args.file))
    n_ctx = args.ctx or min(512, model.n_ctx)
    keep = bool(args.save_logits or args.kl_divergence)
    result = model.perplexity(tokens, n_ctx=n_ctx, keep_logits=keep)
    report = {"model": str(model.path), "n_tokens": len(tokens), **result.to_dict()}
    if args.save_logits:
        torch.save({"model": str(model.path), "n_ctx": n_ctx, "targets": result.targets, "ppl": result.ppl,
                    "logits": result.logits}, args.save_logits)
        report["saved_logits"] = args.save_logits
    if args.kl_divergence:
        base = torch.load(args.kl_divergence, weights_only=True)
        if base["targets"] != result.targets or base["n_ctx"] != n_ctx:
            raise StrataError(f"{args.kl_divergence}: saved for other tokens or context ({base['model']}, "
                              f"n_ctx {base['n_ctx']}); run both with the same text and --ctx")
        cmp = compare_logits(base["logits"], result.logits)
        report["base"] = {"model": base["model"], "ppl": base["ppl"]}
        report["kl_divergence"] = cmp.to_dict()
    if args.json:
        print(json.dumps(report))
    else:
        _print(report)
    print_stats(args, model)
    save_routing(args, model)
    return 0


def _print(r: dict) -> None:
    chunks = " ".join(f"[{i + 1}]{p:.4f}" for i, p in enumerate(r["chunk_ppl"]))
    print(f"perplexity: {r['n_tokens']} tokens, {r['n_chunks']} chunks of {r['n_ctx']}, "
          f"{r['n_scored']} scored", file=sys.stderr)
    print(chunks)
    print(f"Final estimate: PPL = {r['ppl']:.4f}")
    if "kl_divergence" in r:
        kl = r["kl_divergence"]
        print(f"base {r['base']['model']}: PPL = {r['base']['ppl']:.4f}")
        print(f"KL divergence: mean {kl['kl_mean']:.6f}, max {kl['kl_max']:.6f}; "
              f"top-1 agreement {100 * kl['top1_agreement']:.2f}% of {kl['n']} positions")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("perplexity", help="perplexity of a text file (llama.cpp's method)")
    add_model_args(p)
    p.add_argument("-f", "--file", required=True, help="UTF-8 text file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--save-logits", metavar="PATH", help="save the scored logits for a later --kl-divergence")
    p.add_argument("--kl-divergence", metavar="BASE", help="compare with logits saved by --save-logits")
    add_save_routing_arg(p)
    p.set_defaults(func=run)
