"""`strata inspect` on converted files (needs strata.gguf, the foundation's reader)."""
from __future__ import annotations

import io
import json
import sys
import types

import pytest

from strata import inspect as inspect_cmd

SUMMARY = {"arch": "qwen3moe", "hparams": {"n_layers": 2, "n_experts": 4},
           "bytes_per_type": {"Q4_K": 1_179_648, "Q8_0": 300_000, "F32": 4096},
           "resident_bytes": 304_096, "expert_bytes": 1_179_648,
           "layers": [{"layer": 0, "slab_bytes": {"gate": 36_864, "up": 36_864, "down": 36_864}}]}


@pytest.fixture
def fake_reader(monkeypatch):
    """Stands in for strata.gguf until it is merged: rendering is what this module owns."""
    mod = types.ModuleType("strata.gguf")
    mod.open_model = lambda path: types.SimpleNamespace(summary=lambda: SUMMARY)
    monkeypatch.setitem(sys.modules, "strata.gguf", mod)


def test_json_output_is_the_summary(fake_reader):
    out = io.StringIO()
    assert inspect_cmd.run(types.SimpleNamespace(model="m.gguf", json=True), out) == 0
    assert json.loads(out.getvalue()) == SUMMARY


def test_text_output(fake_reader):
    out = io.StringIO()
    assert inspect_cmd.run(types.SimpleNamespace(model="m.gguf", json=False), out) == 0
    text = out.getvalue()
    assert "arch: qwen3moe" in text and "Q4_K: 1.12 MiB (1179648)" in text and "gate: 36.00 KiB" in text


def test_parser_wiring(fake_reader, capsys):
    assert inspect_cmd.main(["inspect", "m.gguf", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["arch"] == "qwen3moe"


def test_real_file(tiny_models):
    gguf_mod = pytest.importorskip("strata.gguf")
    if not hasattr(gguf_mod, "open_model"):
        pytest.skip("strata.gguf.open_model not available yet")
    tiny = tiny_models["qwen2moe"]
    out = io.StringIO()
    assert inspect_cmd.run(types.SimpleNamespace(model=str(tiny.gguf()), json=True), out) == 0
    summary = json.loads(out.getvalue())
    assert summary["arch"] == "qwen2moe"
