"""Bad inputs fail with one clear line naming the file/tensor, a non-zero exit, and no output."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from strata.convert import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ckpt(tiny_models, tmp_path) -> Path:
    """A private copy of the fused Qwen3-MoE fixture to break."""
    return Path(shutil.copytree(tiny_models["qwen3moe"].fused, tmp_path / "ckpt"))


def _weights(ckpt: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    (path,) = ckpt.glob("*.safetensors")
    return path, load_file(path)


def _edit_config(ckpt: Path, **changes) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(changes)
    (ckpt / "config.json").write_text(json.dumps(cfg))


def _fails(ckpt: Path, capsys, *patterns: str) -> str:
    out = ckpt.parent / "out.gguf"
    assert main([str(ckpt), "-o", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("strata: error: ") and "\n" not in err, err
    for p in patterns:
        assert p in err, f"{p!r} not in {err!r}"
    assert not out.exists() and not list(ckpt.parent.glob(".out.gguf.*"))
    return err


def test_unsupported_architecture(ckpt, capsys):
    _edit_config(ckpt, architectures=["GPTNeoXForCausalLM"])
    _fails(ckpt, capsys, "config.json", "unsupported architecture GPTNeoXForCausalLM", "Qwen3MoeForCausalLM")


def test_missing_tensor(ckpt, capsys):
    path, w = _weights(ckpt)
    del w["model.layers.1.self_attn.q_proj.weight"]
    save_file(w, path)
    _fails(ckpt, capsys, "missing tensors", "blk.1.attn_q.weight")


def test_missing_experts(ckpt, capsys):
    path, w = _weights(ckpt)
    del w["model.layers.0.mlp.experts.down_proj"]
    save_file(w, path)
    _fails(ckpt, capsys, "layer 0", "experts.down_proj")


def test_unexpected_tensor(ckpt, capsys):
    path, w = _weights(ckpt)
    w["model.layers.0.mystery.weight"] = torch.zeros(4, 4)
    save_file(w, path)
    _fails(ckpt, capsys, path.name, "unexpected tensor model.layers.0.mystery.weight")


def test_shape_mismatch(ckpt, capsys):
    path, w = _weights(ckpt)
    w["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(64, 256)
    save_file(w, path)
    _fails(ckpt, capsys, path.name, "model.layers.0.self_attn.k_proj.weight", "(64, 256)", "expected (128, 256)")


def test_config_contradicts_experts(ckpt, capsys):
    _edit_config(ckpt, num_local_experts=6)  # the key transformers 5 writes
    _fails(ckpt, capsys, "model.layers.0.mlp.gate.weight", "expected (6, 256)")


def test_unknown_dtype(ckpt, capsys):
    path, w = _weights(ckpt)
    w["model.norm.weight"] = torch.zeros(256, dtype=torch.int64)
    save_file(w, path)
    _fails(ckpt, capsys, path.name, "model.norm.weight", "unsupported dtype I64")


def test_truncated_file(ckpt, capsys):
    path, _ = _weights(ckpt)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1000)
    _fails(ckpt, capsys, path.name, "past the end of the file")


def test_garbage_file(ckpt, capsys):
    path, _ = _weights(ckpt)
    path.write_bytes(b"\xff" * 64)
    _fails(ckpt, capsys, path.name, "header length")


def test_missing_config(ckpt, capsys):
    (ckpt / "config.json").unlink()
    _fails(ckpt, capsys, "config.json: missing")


def test_missing_tokenizer(ckpt, capsys):
    (ckpt / "tokenizer.json").unlink()
    _fails(ckpt, capsys, "unsupported tokenizer")


def test_unknown_pre_tokenizer(ckpt, capsys):
    tj = json.loads((ckpt / "tokenizer.json").read_text())
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+|\s+"
    (ckpt / "tokenizer.json").write_text(json.dumps(tj))
    _fails(ckpt, capsys, "tokenizer.json", "--tokenizer-pre")
    assert main([str(ckpt), "-o", str(ckpt.parent / "ok.gguf"), "--no-progress", "--tokenizer-pre", "qwen2"]) == 0


def test_missing_output_directory(ckpt, capsys):
    assert main([str(ckpt), "-o", str(ckpt.parent / "nope" / "x.gguf"), "--no-progress"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_module_entry_point_exit_code(ckpt):
    _edit_config(ckpt, architectures=["BertModel"])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "strata.convert", str(ckpt), "-o", str(ckpt.parent / "x.gguf")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "unsupported architecture BertModel" in r.stderr


def test_rows_not_whole_blocks_fall_back(tiny_models, tmp_path, caplog):
    """Q4_K needs rows of 256: narrower rows get Q8_0 (and a warning), not an error."""
    from converters import TypePolicy
    from gguf import MODEL_TENSOR as MT
    from strata.quant import GGMLType
    policy = TypePolicy.from_args()
    assert policy.choose(MT.FFN_DOWN_EXP, (4, 256, 96), "blk.0.ffn_down_exps.weight") == GGMLType.Q8_0
    assert policy.choose(MT.FFN_DOWN_EXP, (4, 256, 100), "blk.0.ffn_down_exps.weight") == GGMLType.F16
    assert policy.choose(MT.ATTN_NORM, (256,), "blk.0.attn_norm.weight") == GGMLType.F32
    assert policy.choose(MT.FFN_GATE_INP, (4, 256), "blk.0.ffn_gate_inp.weight") == GGMLType.F32
    assert "not whole Q4_K blocks" in caplog.text


def test_router_normalisation_mismatch_warns(ckpt, caplog):
    _edit_config(ckpt, norm_topk_prob=False)  # llama.cpp's qwen3moe always renormalises
    assert main([str(ckpt), "-o", str(ckpt.parent / "w.gguf"), "--no-progress"]) == 0
    assert "norm_topk_prob=False" in caplog.text and "renormalises" in caplog.text


def test_rope_factors_refused_where_llama_cpps_graph_ignores_them(ckpt, capsys):
    """Llama 3's scaling on qwen3moe: llama.cpp's qwen3moe graph reads no rope_freqs, so the file
    would compute another model (llama and llama4 take it: tests/fixtures/rope_scaled.py)."""
    _edit_config(ckpt, rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 16})
    _fails(ckpt, capsys, "config.json", "rope scaling type 'llama3' is not supported for GGUF qwen3moe")
