"""Truncating the model file while decoding ends in one error naming the file and its new size,
never SIGBUS, in both memory modes (direct reads experts through the file's map; tiered through
the pager)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.tiny import zoo

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("truncate_during_decode.py")
TIERED = ["1725184", "448512"]  # the smallest budgets of the tiny qwen3moe (two slots a layer each tier)


@pytest.mark.parametrize("memory, compute, budgets", [("direct", "packed", []), ("direct", "float", []),
                                                     ("tiered", "packed", TIERED)])
def test_truncated_while_decoding_is_one_error(tmp_path, memory, compute, budgets):
    src, path = zoo().get("qwen3moe").gguf(None), tmp_path / "shrinks.gguf"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(ROOT)]))
    run = subprocess.run([sys.executable, str(SCRIPT), str(src), str(path), memory, compute, *budgets],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, f"status {run.returncode} (-7: SIGBUS): {run.stderr[-2000:]}"
    truncated, result = run.stdout.strip().splitlines()[-2:]
    size = int(truncated.split()[1])
    assert result.startswith(f"ERROR {path}: "), result
    assert f"is now {size} bytes" in result and f"{src.stat().st_size}" in result, result
    assert "Traceback" not in run.stderr
