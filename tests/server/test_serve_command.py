"""`strata serve` as a command: options refused before anything starts, and a model that fails
to load ends the server with the error and exit status 1."""
from __future__ import annotations

import subprocess
import sys

from strata.cli import main

from .conftest import ROOT, free_port


def test_bad_options(capsys, tiny_path, tmp_path):
    assert main(["serve", str(tmp_path / "none.gguf")]) == 1
    assert "none.gguf: no such model file" in capsys.readouterr().err
    assert main(["serve", str(tiny_path), "--max-batch", "0"]) == 1
    assert "--max-batch: expected an integer >= 1 and <= 4096, found 0" in capsys.readouterr().err
    assert main(["serve", str(tiny_path), "--max-queue", "-1"]) == 1
    assert "--max-queue" in capsys.readouterr().err
    assert main(["serve", str(tiny_path), "--gather-ms", "-1"]) == 1
    assert "--gather-ms: expected an integer >= 0 and <= 10000, found -1" in capsys.readouterr().err


def test_a_model_that_fails_to_load_ends_the_server(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    done = subprocess.run([sys.executable, "-m", "strata", "serve", str(bad), "--port", str(free_port()),
                           "--log-level", "warning"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1, done.stderr
    assert "strata: error:" in done.stderr and "bad.gguf" in done.stderr
