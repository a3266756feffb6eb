"""`python -m strata.convert HF_DIR -o OUT.gguf`: Hugging Face MoE checkpoint -> GGUF.

Attention and other 2-D shared weights in --attn (Q8_0), routed experts in --experts (Q4_K),
shared experts in --shared-experts (same as --attn), norms, routers and biases in float32;
--outtype sets all three at once. This module parses the arguments and calls
`converters.convert`.

Miss stand-ins (low-bit copies of every routed expert for `--miss-stand-in TYPE`) go to a sidecar
`OUT.standins.gguf` beside the model, never into it (llama.cpp refuses a model file with tensors
it does not create): `--stand-ins TYPE` writes it after converting; `--add-stand-ins TYPE
MODEL.gguf` writes it for a GGUF file that exists (no checkpoint, no -o).

Must not convert anything itself: the work is in the `converters` package.
"""
from __future__ import annotations

import argparse
import logging
import time
from typing import Callable, Sequence

from strata.defaults import CONVERT_OUTTYPES, CONVERT_TYPES, DEFAULT_ATTN_TYPE, DEFAULT_EXPERTS_TYPE

from .errors import run_guarded


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="python -m strata.convert", description=__doc__.splitlines()[0])
    p.add_argument("hf_dir", help="Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer); "
                   "with --add-stand-ins, the GGUF model")
    p.add_argument("-o", "--output", default=None, help="GGUF file to write (required unless --add-stand-ins)")
    p.add_argument("--attn", default=DEFAULT_ATTN_TYPE, choices=CONVERT_TYPES,
                   help=f"type of attention and other 2-D shared weights (default {DEFAULT_ATTN_TYPE})")
    p.add_argument("--experts", default=DEFAULT_EXPERTS_TYPE, choices=CONVERT_TYPES,
                   help=f"type of routed experts (default {DEFAULT_EXPERTS_TYPE})")
    p.add_argument("--shared-experts", default=None, choices=CONVERT_TYPES,
                   help="type of shared experts (default: --attn)")
    p.add_argument("--outtype", default=None, choices=CONVERT_OUTTYPES, help="one type for all of the above")
    p.add_argument("--name", default=None, help="general.name (default: the folder's name)")
    p.add_argument("--threads", type=int, default=None, help="quantization threads (default: all CPUs)")
    p.add_argument("--tokenizer-pre", default=None, help="llama.cpp pre-tokenizer name, when it cannot be detected")
    p.add_argument("--routing-stats", metavar="FILE.npz", default=None,
                   help="embed routing statistics saved by strata perplexity/generate --save-routing")
    p.add_argument("--calib", metavar="TEXT_FILE", default=None,
                   help="GPTQ: calibrate every layer on this text (records its routing statistics too)")
    p.add_argument("--calib-tokens", type=int, default=None, metavar="N", help="calibration tokens (default 8192)")
    p.add_argument("--calib-ctx", type=int, default=None, metavar="N", help="calibration sequence length (default 512)")
    p.add_argument("--imatrix", metavar="FILE", default=None,
                   help="importance matrix (llama.cpp's GGUF or legacy format) for importance-weighted rounding")
    add_split_arg(p)
    p.add_argument("--stand-ins", metavar="TYPE", default=None,
                   help="also write OUT.standins.gguf: every routed expert in TYPE (q2_k, q4_k, q6_k, q8_0), which "
                        "--miss-stand-in TYPE then loads instead of building it at load")
    p.add_argument("--add-stand-ins", metavar="TYPE", default=None,
                   help="convert nothing: write MODEL.standins.gguf (stand-ins of TYPE) beside the GGUF model "
                        "given in place of the checkpoint folder (the model file is not changed)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _progress_bar(enabled: bool) -> Callable[[int], object] | None:
    """A tqdm bar over source bytes: bytes done, rate and time left."""
    if not enabled:
        return None

    def start(total: int) -> object:
        from tqdm import tqdm
        return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="converting", dynamic_ncols=True)

    return start


def _calib_options(args: argparse.Namespace):
    from converters.calib import DEFAULT_CALIB_CTX, DEFAULT_CALIB_TOKENS, CalibOptions
    from strata.errors import StrataError

    if args.calib is None:
        if args.calib_tokens is not None or args.calib_ctx is not None:
            raise StrataError("--calib-tokens and --calib-ctx need --calib TEXT_FILE")
        return None
    n, ctx = args.calib_tokens or DEFAULT_CALIB_TOKENS, args.calib_ctx or DEFAULT_CALIB_CTX
    if n < 1 or ctx < 1:
        raise StrataError(f"--calib-tokens and --calib-ctx must be positive, found {n} and {ctx}")
    return CalibOptions(args.calib, n, ctx, progress=not args.no_progress)


def add_split_arg(p: argparse.ArgumentParser) -> None:
    """--split-max-size, for the commands that write GGUF files (convert, synth); see split_size."""
    p.add_argument("--split-max-size", metavar="SIZE", default=None,
                   help="write parts of at most SIZE tensor bytes (e.g. 500M, 2G; K/M/G are 10^3/10^6/10^9 as in "
                        "llama.cpp) named OUT-00001-of-0000N.gguf, in llama.cpp's gguf-split layout")


def split_size(text: str | None) -> int:
    """--split-max-size in bytes (0 when not given), or StrataError saying what is wrong."""
    from strata.errors import StrataError
    from strata.gguf.split import parse_split_size

    if text is None:
        return 0
    try:
        return parse_split_size(text)
    except ValueError as exc:
        raise StrataError(str(exc)) from None


def _stand_ins(model: str, t: str, n_threads: int | None, start: float) -> None:
    from converters.stand_ins import write_stand_ins

    from .summary import written_line

    path = write_stand_ins(model, t, n_threads=n_threads)
    print(written_line(path, time.perf_counter() - start, model=False), flush=True)


def convert(args: argparse.Namespace) -> int:
    """Convert as the parsed arguments say; errors propagate to `run`."""
    from converters import TypePolicy, convert as convert_checkpoint
    from strata.errors import StrataError
    from strata.memory.standin import stand_in_type

    from .summary import first_part, written_line

    start = time.perf_counter()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    for t in (getattr(args, "stand_ins", None), getattr(args, "add_stand_ins", None)):
        if t is not None:
            stand_in_type(t)  # a bad type fails before hours of conversion
    if getattr(args, "add_stand_ins", None) is not None:
        if args.output is not None or args.stand_ins is not None:
            raise StrataError("--add-stand-ins TYPE MODEL.gguf writes MODEL.standins.gguf: drop -o and --stand-ins")
        _stand_ins(args.hf_dir, args.add_stand_ins, args.threads, start)
        return 0
    if args.output is None:
        raise StrataError("-o/--output OUT.gguf is required to convert a checkpoint")
    policy = TypePolicy.from_args(args.attn, args.experts, args.shared_experts, args.outtype)
    convert_checkpoint(args.hf_dir, args.output, policy, name=args.name, n_threads=args.threads,
                       tokenizer_pre=args.tokenizer_pre, progress=_progress_bar(not args.no_progress),
                       routing_stats=args.routing_stats, calib=_calib_options(args), imatrix=args.imatrix,
                       split_max_size=split_size(getattr(args, "split_max_size", None)))
    print(written_line(args.output, time.perf_counter() - start), flush=True)
    if getattr(args, "stand_ins", None) is not None:
        _stand_ins(str(first_part(args.output)), args.stand_ins, args.threads, time.perf_counter())
    return 0


#: What Ctrl-C prints: the converter removes its partial output.
INTERRUPTED = "strata: interrupted: no output written"


def run(args: argparse.Namespace) -> int:
    """`convert(args)` with the commands' error handling: one line `strata: error: ...`, exit 1."""
    return run_guarded(convert, args, interrupted=INTERRUPTED)


def add_parser(subparsers) -> None:
    """`strata convert`: the same options as `python -m strata.convert` (one parser definition)."""
    p = subparsers.add_parser("convert", help="convert a Hugging Face MoE checkpoint to GGUF",
                              description=__doc__.splitlines()[0].replace("python -m strata.convert", "strata convert"))
    build_parser(p)
    p.set_defaults(func=convert, interrupted=INTERRUPTED)


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
