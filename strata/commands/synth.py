"""`strata synth OUT.gguf --preset NAME --size SIZE` (or an explicit shape): a random-weight MoE
GGUF of any size in llama.cpp's conventions, with routing skewed like a real model's.
Must not: hold the writer (strata.synth.gguf_file does); it parses, plans and reports.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace

from strata.errors import StrataError
from strata.units import format_bytes

from .convert import add_split_arg, split_size
from .summary import written_line


def _shape(args: argparse.Namespace):
    from strata.memory.budget import parse_bytes
    from strata.synth.gguf_file import PRESETS, ROUTER_SKEW, Shape, preset_shape

    if args.preset:
        size = parse_bytes(args.size, "--size")
        if size is None:
            raise StrataError(f"--preset {args.preset} needs --size (e.g. 200M, 50G)")
        try:
            shape = preset_shape(args.preset, size, expert_type=args.expert_type, seed=args.seed)
        except (ValueError, KeyError) as exc:
            raise StrataError(str(exc).strip("'\"")) from None
        return shape, PRESETS[args.preset].note
    if args.size is not None:
        raise StrataError("--size scales a --preset; with an explicit shape give --layers instead")
    shape = Shape(arch=args.arch, n_layers=args.layers, n_experts=args.experts, top_k=args.top_k,
                  hidden=args.hidden, ff=args.ff, n_head=args.heads, n_head_kv=args.heads_kv, vocab=args.vocab,
                  expert_type=args.expert_type, weight_scale=args.weight_scale,
                  skew=ROUTER_SKEW if args.skew is None else args.skew, seed=args.seed)
    return shape, "explicit shape"


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from strata.synth.gguf_file import file_bytes, write

    shape, note = _shape(args)
    split = split_size(args.split_max_size)
    if args.skew is not None and args.preset:
        shape = replace(shape, skew=args.skew)
    try:
        from strata.synth.gguf_file import check_shape

        check_shape(shape)
    except ValueError as exc:
        raise StrataError(str(exc)) from None
    total = file_bytes(shape)
    print(f"{args.out}: {shape.arch}, {shape.n_layers} layers, {shape.n_experts} experts top-{shape.top_k}, hidden "
          f"{shape.hidden}, expert FFN {shape.ff}, heads {shape.n_head}/{shape.n_head_kv}, vocab {shape.vocab}, "
          f"{shape.expert_type} experts, {f'router skew {shape.skew:g}' if shape.skew else 'Gaussian routers'}; "
          f"{format_bytes(total)} ({note})")
    if args.dry_run:
        return 0
    start = time.perf_counter()
    with tqdm(total=total, unit="B", unit_scale=True, disable=args.quiet, desc="writing") as bar:
        last = [0]

        def progress(done: int, _total: int) -> None:
            bar.update(done - last[0])
            last[0] = done

        try:
            first = write(args.out, shape, progress=progress, split_max_size=split)
        except OSError as exc:
            raise StrataError(f"{args.out}: cannot write: {exc.strerror or exc}") from None
    if str(first) != str(args.out):
        print(f"{args.out}: written in llama.cpp's split layout; open the model with its first part, {first}")
    print(written_line(first, time.perf_counter() - start))
    return 0


def add_parser(subparsers) -> None:
    from strata.synth.presets import PRESETS

    p = subparsers.add_parser("synth", help="write a random-weight MoE GGUF of any size (presets of real models "
                                            "scaled down, routing skewed like a real model's)")
    p.add_argument("out", help="output GGUF file")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="; ".join(f"{k}: {v.note}" for k, v in PRESETS.items()))
    p.add_argument("--size", default=None, help="file size for --preset, e.g. 200M or 50G")
    p.add_argument("--expert-type", default="Q4_K", help="expert tensor type: Q4_K (default), Q4_0, Q5_K, Q6_K, Q8_0")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    g = p.add_argument_group("explicit shape (without --preset)")
    g.add_argument("--arch", choices=("qwen3moe", "llama"), default="qwen3moe")
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--experts", type=int, default=64)
    g.add_argument("--top-k", type=int, default=8)
    g.add_argument("--hidden", type=int, default=1024)
    g.add_argument("--ff", type=int, default=512, help="expert FFN width")
    g.add_argument("--heads", type=int, default=8)
    g.add_argument("--heads-kv", type=int, default=2)
    g.add_argument("--vocab", type=int, default=512)
    g.add_argument("--weight-scale", type=float, default=0.3)
    g.add_argument("--skew", type=float, default=None,
                   help="router popularity exponent of the routing recipe (README; default 0.1; 0: Gaussian "
                        "routers, near-uniform routing with no layer-to-layer locality)")
    add_split_arg(p)
    p.add_argument("--dry-run", action="store_true", help="print the shape and size, write nothing")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
