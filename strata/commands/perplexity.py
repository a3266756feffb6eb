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
    if args.batch_size is not None and args.batch_size < 1:
        raise StrataError(f"--batch-size {args.batch_size}: expected a positive number of tokens per forward pass")
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
    progress = Progress(json_out=args.json)
    if not args.json:
        print(f"perplexity: {len(tokens)} tokens in chunks of {n_ctx}", file=sys.stderr)
    result = model.perplexity(tokens, n_ctx=n_ctx, keep_logits=keep, on_chunk=progress, batch_size=args.batch_size)
    progress.close()
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


class Progress:
    """After each chunk, its running PPL as llama.cpp prints it (`[1]12.3456,[2]11.9876,...`),
    preceded after the first chunk by the time per chunk and the ETA on stderr. The values go to
    stdout, or with --json to stderr, and there only when stderr is a terminal (stdout then
    holds the JSON object alone)."""

    def __init__(self, json_out: bool):
        self.out = None if json_out and not sys.stderr.isatty() else sys.stderr if json_out else sys.stdout
        self.started = False

    def __call__(self, done) -> None:
        if self.out is None:
            return
        if done.chunk == 1 and done.n_chunks > 1:
            per = done.seconds
            print(f"perplexity: {per:.2f} s per chunk, ETA {_duration(per * (done.n_chunks - 1))} for the "
                  f"other {done.n_chunks - 1} chunks", file=sys.stderr, flush=True)
        print(f"{',' if self.started else ''}[{done.chunk}]{done.ppl:.4f}", end="", file=self.out, flush=True)
        self.started = True

    def close(self) -> None:
        if self.started:
            print(file=self.out, flush=True)


def _duration(seconds: float) -> str:
    """12.3 -> "12 s"; 150 -> "2 min 30 s"; 7300 -> "2 h 1 min"."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _print(r: dict) -> None:
    print(f"perplexity: {r['n_chunks']} chunks of {r['n_ctx']}, {r['n_scored']} tokens scored", file=sys.stderr)
    err = "" if r["ppl_stderr"] is None else f" +/- {r['ppl_stderr']:.4f}"
    print(f"Final estimate: PPL = {r['ppl']:.4f}{err}")
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
    p.add_argument("-b", "--batch-size", type=int, default=None, metavar="N",
                   help="tokens per forward pass (default: a whole chunk at once); 1 scores one token at a time, "
                        "so the expert memory (misses, stand-ins) meets the experts as decoding does")
    p.add_argument("--save-logits", metavar="PATH", help="save the scored logits for a later --kl-divergence")
    p.add_argument("--kl-divergence", metavar="BASE", help="compare with logits saved by --save-logits")
    add_save_routing_arg(p)
    p.set_defaults(func=run)
