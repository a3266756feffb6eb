from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from strata.cli import main
from tests.fixtures.tiny import zoo

torch.set_num_threads(1)  # tiny matrices: see tests/models/conftest.py
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli(capsys):
    """Run `strata ARGS` in this process: (exit code, stdout, stderr)."""
    def run(*args: str) -> tuple[int, str, str]:
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture(scope="session")
def subprocess_env() -> dict[str, str]:
    """Environment for `python -m strata` in a child process running this tree's package."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, PYTHONIOENCODING="utf-8", OMP_NUM_THREADS="1")


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def qwen3():
    return zoo().get("qwen3moe")
