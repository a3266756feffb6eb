"""`strata inspect` on converted files."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import types

from strata.commands import inspect as inspect_cmd
from strata.gguf import open_model


def test_json_output_is_the_summary(tiny_models):
    path = tiny_models["qwen2moe"].gguf()
    out = io.StringIO()
    assert inspect_cmd.run(types.SimpleNamespace(model=str(path), json=True), out) == 0
    summary = json.loads(out.getvalue())
    verdict = summary.pop("verdict")  # what inspect adds to the file's own summary
    assert verdict["runs"] and verdict["compute"] == "packed" and verdict["sentence"].startswith("runs: qwen2moe")
    with open_model(path) as mf:
        assert summary == json.loads(json.dumps(mf.summary(), default=str))
        assert summary["arch"] == "qwen2moe"
        assert summary["hparams"]["n_experts"] == mf.hparams.n_experts > 0


def test_text_output_through_the_cli(tiny_models):
    path = tiny_models["qwen3moe"].gguf()
    res = subprocess.run([sys.executable, "-m", "strata", "inspect", str(path), "--raw"], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    assert "arch: qwen3moe" in res.stdout
    assert "Q4_K:" in res.stdout and "expert" in res.stdout
    head = res.stdout.splitlines()[:8]
    assert any(line.startswith("verdict: runs: qwen3moe, packed compute") for line in head), head


def test_missing_file_is_one_clear_line(tmp_path):
    missing = tmp_path / "nope.gguf"
    res = subprocess.run([sys.executable, "-m", "strata", "inspect", str(missing)], capture_output=True, text=True)
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1 and "nope.gguf" in res.stderr and "Traceback" not in res.stderr


def test_malformed_file_is_one_clear_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUX" + bytes(60))
    res = subprocess.run([sys.executable, "-m", "strata", "inspect", str(bad)], capture_output=True, text=True)
    assert res.returncode == 1
    assert "bad.gguf" in res.stderr and "not a GGUF file" in res.stderr and "Traceback" not in res.stderr
