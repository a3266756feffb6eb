"""strata.synth: the shared synthetic checkpoints read back as the files they claim to be."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from strata.synth import CHAT_TEMPLATE, SPECIALS, build_checkpoint, write_checkpoint, write_safetensors
from strata.synth.safetensors import to_bf16


def test_safetensors_writer_round_trips_f32_and_bf16(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    b = np.array([1.0, -2.5, 3.140625], dtype=np.float32)  # exact in bfloat16
    path = tmp_path / "t.safetensors"
    n = write_safetensors(path, {"a": ("F32", (3, 4)), "b": ("BF16", (3,))},
                          lambda name: a if name == "a" else to_bf16(b))
    assert n == 12 * 4 + 3 * 2
    back = load_file(path)
    assert torch.equal(back["a"], torch.from_numpy(a))
    assert back["b"].dtype == torch.bfloat16 and back["b"].float().tolist() == [1.0, -2.5, 3.140625]


def test_safetensors_writer_refuses_a_wrong_size(tmp_path):
    with pytest.raises(ValueError, match=r"tensor a \(F32 \[2, 2\]\) should be 16 bytes, got 12"):
        write_safetensors(tmp_path / "t.safetensors", {"a": ("F32", (2, 2))}, lambda _: np.zeros(3, np.float32))


def test_tiny_checkpoint_is_deterministic_and_uses_the_shared_tokens(tmp_path):
    one = build_checkpoint(tmp_path / "one", num_hidden_layers=1, num_experts=4)
    two = build_checkpoint(tmp_path / "two", num_hidden_layers=1, num_experts=4)
    w1, w2 = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)
    assert w1["model.layers.0.mlp.experts.3.down_proj.weight"].shape == (256, 256)
    assert float(w1["model.embed_tokens.weight"].std()) == pytest.approx(1.0, abs=0.02)
    cfg = json.loads((one / "config.json").read_text())
    tok = json.loads((one / "tokenizer.json").read_text())
    assert [t["content"] for t in tok["added_tokens"]] == SPECIALS
    assert cfg["eos_token_id"] == SPECIALS.index("<|im_end|>") == 2
    assert json.loads((one / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE


def test_streamed_checkpoint_has_the_bytes_its_index_says(tmp_path):
    total = write_checkpoint(tmp_path, hidden=256, n_layers=2, n_experts=2, moe_ff=256)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == total
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors |= load_file(tmp_path / shard)
    assert set(tensors) == set(index["weight_map"])
    assert sum(t.numel() * 2 for t in tensors.values()) == total
    assert float(tensors["model.layers.1.mlp.experts.1.up_proj.weight"].float().std()) == pytest.approx(0.02, rel=0.05)
    tok = json.loads((tmp_path / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) + len(tok["added_tokens"]) == 512
    assert [t["content"] for t in tok["added_tokens"][:3]] == SPECIALS
