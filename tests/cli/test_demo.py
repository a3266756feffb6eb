"""`strata demo` as a user runs it on a fresh machine: one command, files where it says."""
from __future__ import annotations

import subprocess


def test_demo_runs_and_reports_its_files(tmp_path, python, subprocess_env):
    out = subprocess.run([python, "-m", "strata", "demo", "--dir", str(tmp_path), "--threads", "1"],
                         env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line[:5] for line in lines[:4]] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"]
    for name in ("checkpoint/config.json", "checkpoint/model.safetensors", "checkpoint/tokenizer.json",
                 "demo-q8_0-q4_k.gguf"):
        assert (tmp_path / name).is_file() and str(tmp_path) in out.stdout
    assert "24 tokens" in lines[2]
