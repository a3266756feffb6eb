"""The `strata` command: one parser whose subcommands live in `strata.commands`, one error style.

Each command module contributes its subcommand through `add_parser(subparsers)`, parses its
arguments and calls the public API; none formats errors itself (`strata.commands.errors` does).

Must not hold a command's options or logic: it gathers the parsers and runs the chosen one.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import sys
import warnings

from strata.commands.errors import run_guarded

#: Modules that each contribute subcommands through `add_parser(subparsers)`.
COMMAND_MODULES = ("strata.commands.bench", "strata.commands.inspect", "strata.commands.generate",
                   "strata.commands.chat", "strata.commands.serve", "strata.commands.perplexity",
                   "strata.commands.demo", "strata.commands.synth", "strata.commands.imatrix",
                   "strata.commands.convert")


def version() -> str:
    """The installed package's version (its metadata), else the source tree's `strata.__version__`."""
    from importlib import metadata

    try:
        return metadata.version("strata")
    except metadata.PackageNotFoundError:
        import strata

        return strata.__version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strata", description="Mixture-of-Experts inference with tiered expert memory.")
    parser.add_argument("--version", action="version", version=f"strata {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Strata's own warnings as one `strata: warning:` line; others as Python prints them."""
    from strata.errors import ContextWarning, SlowPathWarning

    if issubclass(category, (SlowPathWarning, ContextWarning)):
        print(f"strata: warning: {message}", file=file or sys.stderr)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = _show_warning
    from strata.commands.bench import normalize_argv

    args = build_parser().parse_args(normalize_argv(list(sys.argv[1:] if argv is None else argv)))
    code = run_guarded(args.func, args, interrupted=getattr(args, "interrupted", "strata: interrupted"))
    group = sys.modules.get("strata.distributed.group")  # imported only by expert-parallel runs
    if group is not None:
        group.exit_if_broken(code)  # a broken group's teardown would abort the process
    if argv is None:  # the process ends with the command (`strata ...`, `python -m strata ...`): its teardown's
        gc.freeze()   # last collection need not walk torch's objects, freed with the process (0.2-0.3 s of a one-shot run)
    return code


if __name__ == "__main__":
    sys.exit(main())
