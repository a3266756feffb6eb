"""Converting Qwen3NextForCausalLM: llama.cpp's qwen3next tensor names, ssm.* keys and values."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from gguf import GGUFReader

from converters import ConversionError, TypePolicy, convert
from tests.fixtures.tiny import zoo


def _field(r: GGUFReader, key: str):
    return r.fields[key].contents()


def test_qwen3next_tensors_and_metadata():
    tiny = zoo().get("qwen3next")
    r = GGUFReader(tiny.gguf("f32"))
    assert _field(r, "general.architecture") == "qwen3next"
    keys = {"ssm.conv_kernel": 4, "ssm.state_size": 32, "ssm.group_count": 2, "ssm.time_step_rank": 4,
            "ssm.inner_size": 128, "full_attention_interval": 4, "rope.dimension_count": 16,
            "attention.recurrent_layers": [True, True, True, False], "expert_shared_feed_forward_length": 256}
    assert {k: _field(r, f"qwen3next.{k}") for k in keys} == keys
    t = {x.name: x for x in r.tensors}
    shapes = {"blk.0.attn_qkv.weight": [256, 256], "blk.0.attn_gate.weight": [256, 128], "blk.0.ssm_a": [4],
              "blk.0.ssm_conv1d.weight": [4, 256], "blk.0.ssm_dt.bias": [4], "blk.0.ssm_ba.weight": [256, 8],
              "blk.0.ssm_norm.weight": [32], "blk.0.ssm_out.weight": [128, 256], "blk.3.attn_q.weight": [256, 512]}
    assert {n: t[n].shape.tolist() for n in shapes} == shapes
    assert "blk.3.attn_qkv.weight" not in t and "blk.0.attn_q.weight" not in t
    la = tiny.model.model.layers[0].linear_attn
    np.testing.assert_allclose(t["blk.0.ssm_a"].data, -np.exp(la.A_log.detach().numpy()), rtol=1e-6)
    np.testing.assert_allclose(t["blk.0.attn_norm.weight"].data,
                               tiny.model.model.layers[0].input_layernorm.weight.detach().numpy() + 1, rtol=1e-6)
    # qkvz per key head [q, k, v-group, z-group] -> attn_qkv [all q | all k | all v] and attn_gate [all z]
    w = la.in_proj_qkvz.weight.detach().numpy().reshape(2, 32 + 32 + 64 + 64, 256)
    qkv = np.concatenate([w[:, :32].reshape(-1, 256), w[:, 32:64].reshape(-1, 256), w[:, 64:128].reshape(-1, 256)])
    np.testing.assert_array_equal(t["blk.0.attn_qkv.weight"].data, qkv)
    np.testing.assert_array_equal(t["blk.0.attn_gate.weight"].data, w[:, 128:].reshape(-1, 256))


def test_qwen3next_refuses_unequal_head_dims(tmp_path):
    tiny = zoo().get("qwen3next")
    hf = tmp_path / "hf"
    shutil.copytree(tiny.hf_dir, hf)
    cfg = json.loads((hf / "config.json").read_text())
    cfg["linear_value_head_dim"] = 64
    (hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="linear_value_head_dim=64.*equal head dims"):
        convert(hf, tmp_path / "out.gguf", TypePolicy.from_args(outtype="f32"))
