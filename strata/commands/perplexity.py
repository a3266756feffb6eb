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


#: Bytes of text perplexity reads at most (a device like /dev/zero never ends).
MAX_TEXT_BYTES = 256 << 20
#: What a --save-logits file holds, and the type of each entry.
SAVED_KEYS = {"model": str, "n_ctx": int, "targets": list, "ppl": float, "logits": object}


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TEXT_BYTES + 1)
        if len(data) > MAX_TEXT_BYTES:
            raise StrataError(f"{path}: expected a text file of at most {MAX_TEXT_BYTES} bytes, found more")
        return data.decode("utf-8")
    except OSError as exc:
        raise StrataError(f"{path}: cannot read the text file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise StrataError(f"{path}: expected UTF-8 text, found invalid bytes at byte {exc.start}") from None


def _check_output(path: str) -> None:
    """Refuse a --save-logits path whose directory is missing before the run, not after it."""
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise StrataError(f"--save-logits {path}: the directory {parent} does not exist")


def _load_base(path: str) -> dict:
    """The logits saved by --save-logits at `path`, every expected entry checked."""
    import torch

    try:
        base = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise StrataError(f"--kl-divergence {path}: no such file") from None
    except Exception as exc:  # torch raises several types for a file that is not one of its own
        raise StrataError(f"--kl-divergence {path}: not a file saved by --save-logits ({type(exc).__name__})") from None
    if not isinstance(base, dict):
        raise StrataError(f"--kl-divergence {path}: expected a dict saved by --save-logits, found "
                          f"{type(base).__name__}")
    for key, kind in SAVED_KEYS.items():
        value = base.get(key)
        ok = isinstance(value, torch.Tensor) and value.dim() == 2 if key == "logits" else isinstance(value, kind)
        if kind is float:
            ok = isinstance(value, (int, float))
        if not ok:
            raise StrataError(f"--kl-divergence {path}: entry {key!r}: expected "
                              f"{'a 2-D tensor' if key == 'logits' else kind.__name__}, found {type(value).__name__}")
    return base


def run(args: argparse.Namespace) -> int:
    if args.save_logits:
        _check_output(args.save_logits)
    base = _load_base(args.kl_divergence) if args.kl_divergence else None
    text = _read_text(args.file)
    with load_model(args) as model:
        return _run(args, model, text, base)


def _run(args: argparse.Namespace, model, text: str, base: dict | None) -> int:
    import torch

    from strata.engine import compare_logits

    tokens = model.tokenize(text)
    n_ctx = args.ctx or min(512, model.n_ctx)
    keep = bool(args.save_logits or args.kl_divergence)
    result = model.perplexity(tokens, n_ctx=n_ctx, keep_logits=keep)
    report = {"model": str(model.path), "n_tokens": len(tokens), **result.to_dict()}
    if args.save_logits:
        try:
            torch.save({"model": str(model.path), "n_ctx": n_ctx, "targets": result.targets, "ppl": result.ppl,
                        "logits": result.logits}, args.save_logits)
        except (OSError, RuntimeError) as exc:
            raise StrataError(f"--save-logits {args.save_logits}: cannot write: {exc}") from None
        report["saved_logits"] = args.save_logits
    if base is not None:
        if base["targets"] != result.targets or base["n_ctx"] != n_ctx or base["logits"].shape != result.logits.shape:
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
