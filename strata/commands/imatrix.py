"""`strata imatrix MODEL.gguf -f TEXT_FILE -o FILE`: an importance matrix in llama.cpp's GGUF
imatrix format (what `llama-imatrix` writes), for `python -m strata.convert --imatrix FILE` or
`llama-quantize --imatrix FILE`.

Must not compute: the work is `converters.calib.collect`'s; this module parses, calls, prints.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from strata.errors import StrataError

from .common import add_hf_arg, resolve_model
from .perplexity import _read_text
from .summary import written_line


def run(args: argparse.Namespace) -> int:
    from converters.calib.collect import collect_imatrix

    if args.chunks is not None and args.chunks < 1 or args.ctx < 1:
        raise StrataError(f"--chunks and --ctx must be positive, found {args.chunks} and {args.ctx}")
    if not Path(args.output).resolve().parent.is_dir():
        raise StrataError(f"{args.output}: output directory {Path(args.output).resolve().parent} does not exist")
    resolve_model(args)
    text = _read_text(args.file)
    n_tokens = args.chunks * args.ctx if args.chunks else 1 << 62
    summary = collect_imatrix(args.model, text, args.output, n_tokens=n_tokens, n_ctx=args.ctx, dataset=args.file,
                              n_threads=args.threads, progress=not args.no_progress)
    if args.json:
        print(json.dumps({"output": args.output, **summary}))
    else:
        print(f"imatrix: {summary['tensors']} tensors over {summary['chunks']} chunks of {summary['chunk_size']} "
              f"tokens", file=sys.stderr)
        print(written_line(args.output, summary["seconds"], model=False))
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("imatrix", help="importance matrix of a model over a text (llama.cpp's format)")
    p.add_argument("model", nargs="?", default=None, help="GGUF model file, or -hf")
    add_hf_arg(p)
    p.add_argument("-f", "--file", required=True, help="UTF-8 text file")
    p.add_argument("-o", "--output", required=True, help="imatrix file to write (GGUF)")
    p.add_argument("--ctx", type=int, default=512, help="tokens per chunk (default 512)")
    p.add_argument("--chunks", type=int, default=None, help="chunks to process at most (default: the whole text)")
    p.add_argument("--threads", type=int, default=None, help="threads (default: all CPUs)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
