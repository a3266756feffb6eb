"""A model file cut to half its size while `strata generate` runs on it, in every memory mode: exit
status 1 and one `strata: error:` line naming the file, never a signal (SIGBUS was the direct
memory's end: its decode program reads the experts in place from the file's map).

The cut comes at one moment of the running command (truncate_while_running.py): right after the
first check of the file once a token has been generated, so no timing is involved."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.tiny import zoo

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("truncate_while_running.py")
#: memory -> `strata generate` options: budgets so small that the paged and tiered memories keep
#: reading experts from the file (tiny qwen3moe: two slots a layer; the tiered memory proper runs float)
MODES = {
    "direct": ["--memory", "direct"],
    "direct-float": ["--memory", "direct", "--compute", "float"],
    "paged": ["--memory", "paged", "--host-mem", "448512"],
    "tiered": ["--memory", "tiered", "--compute", "float", "--device-mem", "6000000", "--host-mem", "448512",
               "--prefetch-depth", "1"],
}


def run_cut(path: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(SCRIPT), str(path), *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.parametrize("mode", MODES)
def test_generate_on_a_file_cut_short_is_one_error(tmp_path, mode):
    src, path = zoo().get("qwen3moe").gguf(None), tmp_path / "shrinks.gguf"
    shutil.copyfile(src, path)
    size = path.stat().st_size
    run = run_cut(path, ["generate", str(path), "-p", "Hello world, this is a test", "-n", "40", "--ignore-eos",
                         "--temperature", "0", "--threads", "1", "--ctx", "128", *MODES[mode]])
    assert run.returncode == 1, f"status {run.returncode} (-7: SIGBUS): {run.stderr[-2000:]}"
    lines = run.stderr.strip().splitlines()
    assert lines[0] == f"TRUNCATED {size // 2}", run.stderr
    assert lines[1:] == [f"strata: error: {path}: the file shrank while in use: it is now {size // 2} bytes, it had "
                         f"{size} when opened; load the model again"], run.stderr
    assert run.stdout, "the command generated text before the cut"


def test_generate_on_a_whole_file_runs_under_the_same_harness(tmp_path):
    """The control: the harness cuts nothing when the command ends with its first token, and the
    command exits as it would without it."""
    src, path = zoo().get("qwen3moe").gguf(None), tmp_path / "whole.gguf"
    shutil.copyfile(src, path)
    run = run_cut(path, ["generate", str(path), "-p", "Hello", "-n", "1", "--threads", "1", "--ctx", "64",
                         *MODES["direct"]])
    assert run.returncode == 0, run.stderr
    assert "TRUNCATED" not in run.stderr
    assert path.stat().st_size == src.stat().st_size
