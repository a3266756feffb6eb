"""The `strata` command: parses arguments and calls the public API, nothing more."""
from __future__ import annotations

import argparse
import importlib
import sys

from strata.errors import StrataError

#: Modules that each contribute subcommands through `add_parser(subparsers)`.
COMMAND_MODULES = ("strata.bench", "strata.inspect", "strata.commands.generate", "strata.commands.chat",
                   "strata.commands.perplexity", "strata.commands.demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strata", description="Mixture-of-Experts inference with tiered expert memory.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (StrataError, OSError) as exc:
        print(f"strata: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `strata ... | head`: the reader left, nothing more to say
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("strata: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
