"""`python -m strata.convert HF_DIR -o OUT.gguf`: the entry point only; the command is
`strata.commands.convert` (arguments) and the work is `converters` (conversion)."""
from __future__ import annotations

import sys

from strata.commands.convert import build_parser, main, run

__all__ = ["build_parser", "main", "run"]

if __name__ == "__main__":
    sys.exit(main())
