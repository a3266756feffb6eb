"""The suite itself: it leaves no temporary files behind, and the README's test command is what CI
runs (`.ci/run`), fetching what it needs itself, so a fresh clone skips no more than CI does."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LEAKY = '''
import tempfile

import pytest


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    d = tmp_path_factory.mktemp("shared")
    (d / "model.bin").write_bytes(bytes(3 << 20))
    return d


def test_writes_everywhere(shared, tmp_path):
    (tmp_path / "big.bin").write_bytes(bytes(4 << 20))
    open(tempfile.mkdtemp() + "/left.bin", "wb").write(bytes(2 << 20))  # never removed by the test


def test_outcome():
    assert OUTCOME
'''


def _run(tmp_path: Path, outcome: bool, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    system_tmp = tmp_path / f"system-tmp-{outcome}"
    system_tmp.mkdir()
    test = tmp_path / f"case_{outcome}" / "test_leaky.py"
    test.parent.mkdir()
    test.write_text(LEAKY.replace("OUTCOME", str(outcome)))
    env = dict(os.environ, TMPDIR=str(system_tmp), PYTHONPATH=str(ROOT))
    env.pop("PYTEST_ADDOPTS", None)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.fixtures.temp_root",
                          "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(test.parent), str(test), *args],
                         cwd=test.parent, env=env, capture_output=True, text=True, timeout=120)
    return res, system_tmp


def test_a_passing_run_leaves_nothing_in_the_temp_folder(tmp_path):
    res, system_tmp = _run(tmp_path, True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert list(system_tmp.iterdir()) == [], list(system_tmp.rglob("*"))
    # pytest removed the tmp_path and session folders itself; what the test left in mkdtemp() was 2 MiB
    assert "temporary files the tests left: 2.0 MiB, removed" in res.stdout, res.stdout


def test_a_run_of_no_test_leaves_nothing_either(tmp_path):
    res, system_tmp = _run(tmp_path, True, "-k", "no_such_test")
    assert res.returncode == 5 and list(system_tmp.iterdir()) == [], res.stdout


def test_a_failing_run_keeps_its_files_and_says_where(tmp_path):
    res, system_tmp = _run(tmp_path, False)
    assert res.returncode == 1, res.stdout + res.stderr
    kept = [p for p in system_tmp.iterdir()]
    assert len(kept) == 1 and kept[0].name.startswith("strata-tests-")
    assert f"kept in {kept[0]}" in res.stdout


def test_ci_runs_the_readme_test_command_and_nothing_else():
    readme = (ROOT / "README.md").read_text()
    command2 = re.search(r"# 2\. install what the tests need and run them\n(.+)\n", readme).group(1)
    script = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
              if line.strip() and not line.lstrip().startswith("#")]
    assert script == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', command2]


def test_the_suite_finds_llama_cpps_source_without_being_told(monkeypatch):
    """STRATA_LLAMA_CPP_SRC unset: the tree comes from the suite's own fetch (.ci-cache), as CI's."""
    from tests.fixtures import fetch

    tree = fetch.llama_cpp_tree()
    assert tree is not None and (tree / "convert_hf_to_gguf.py").is_file()
    assert tree.is_relative_to(ROOT / ".ci-cache")
    monkeypatch.setenv("STRATA_TEST_FETCH", "0")
    assert fetch.llama_cpp_tree() == tree  # fetched once, then found
