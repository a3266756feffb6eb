"""`python -m strata.convert HF_DIR -o OUT.gguf`: Hugging Face MoE checkpoint -> GGUF.

Attention and other 2-D shared weights in --attn (Q8_0), routed experts in --experts (Q4_K),
shared experts in --shared-experts (same as --attn), norms, routers and biases in float32;
--outtype sets all three at once. The work is in the `converters` package.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, Sequence

from converters import ConversionError, TypePolicy, convert
from converters.types import CHOICES, OUTTYPES
from strata.errors import StrataError


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="python -m strata.convert", description=__doc__.splitlines()[0])
    p.add_argument("hf_dir", help="Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer)")
    p.add_argument("-o", "--output", required=True, help="GGUF file to write")
    p.add_argument("--attn", default="q8_0", choices=CHOICES, help="type of attention and other 2-D shared weights")
    p.add_argument("--experts", default="q4_k", choices=CHOICES, help="type of routed experts")
    p.add_argument("--shared-experts", default=None, choices=CHOICES, help="type of shared experts (default: --attn)")
    p.add_argument("--outtype", default=None, choices=OUTTYPES, help="one type for all of the above")
    p.add_argument("--name", default=None, help="general.name (default: the folder's name)")
    p.add_argument("--threads", type=int, default=None, help="quantization threads (default: all CPUs)")
    p.add_argument("--tokenizer-pre", default=None, help="llama.cpp pre-tokenizer name, when it cannot be detected")
    p.add_argument("--routing-stats", metavar="FILE.npz", default=None,
                   help="embed routing statistics saved by strata perplexity/generate --save-routing")
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


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    try:
        policy = TypePolicy.from_args(args.attn, args.experts, args.shared_experts, args.outtype)
        convert(args.hf_dir, args.output, policy, name=args.name, n_threads=args.threads,
                tokenizer_pre=args.tokenizer_pre, progress=_progress_bar(not args.no_progress),
                routing_stats=args.routing_stats)
    except (ConversionError, StrataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: no output written", file=sys.stderr)
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
