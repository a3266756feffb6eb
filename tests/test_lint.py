"""ruff's pyflakes rules (F) report nothing in the four trees: unused imports and variables,
undefined names, a redefinition of an unused name, a closure reading a local the function deletes.
A fixture imported from another test module carries `# noqa: F401` on the import and
`# noqa: F811` on each test that takes it."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ["strata", "converters", "tests", "benchmarks"]

# being rewritten for issue 58: the qdot kernel tests being merged into one; empty this list when
# they are in.
EXCLUDED: list[str] = []


def test_ruff_pyflakes_rules_clean():
    pytest.importorskip("ruff")
    cmd = [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--select", "F", "--output-format",
           "concise", "--force-exclude", *(f"--extend-exclude={p}" for p in EXCLUDED), *TREES]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
