"""`strata demo`: build a tiny random MoE model, convert it, generate, chat (see strata.demo)."""
from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from strata.demo import run as run_demo

    run_demo(args.dir, device=args.device, threads=args.threads)
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("demo", help="build, convert and run a tiny random MoE model (no downloads)")
    p.add_argument("--dir", default=None, help="folder for the demo's files (default: a new temporary folder)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all available)")
    p.set_defaults(func=run)
