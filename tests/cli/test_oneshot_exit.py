"""A `strata` process ends with its command: the interpreter's teardown does not walk torch's
objects in a last collection (gc.freeze: 0.2-0.3 s of a one-shot generate); main() called with
arguments (a library caller, the tests) leaves the collector alone."""
from __future__ import annotations

import gc
import sys

from strata.cli import main


def test_the_process_entry_freezes_the_collector_and_a_library_call_does_not(qwen3, monkeypatch, capsys):
    path = str(qwen3.gguf(None))
    argv = ["generate", path, "-p", "the router", "-n", "2", "--threads", "1"]
    gc.unfreeze()
    try:
        assert main(argv) == 0 and gc.get_freeze_count() == 0
        monkeypatch.setattr(sys, "argv", ["strata", *argv])
        assert main() == 0 and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    capsys.readouterr()
