"""pyflakes reports nothing in the packages kept clean: unused imports, undefined names, a
closure reading a local the function deletes."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLEAN = ["strata/gguf", "strata/engine", "strata/server", "benchmarks", "tests/memory/test_pager.py"]


def test_pyflakes_clean():
    pytest.importorskip("pyflakes")
    out = subprocess.run([sys.executable, "-m", "pyflakes", *CLEAN], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
