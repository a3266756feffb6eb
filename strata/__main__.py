"""`python -m strata`: the `strata` command (`strata.cli`). Must not hold anything but the call."""
import sys

from strata.cli import main

sys.exit(main())
