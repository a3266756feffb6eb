"""Converting Qwen3_5MoeForCausalLM: llama.cpp's qwen35moe names and keys, the DeltaNet projections
apart, value heads tiled over key heads, rope.dimension_sections."""
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


def _tiled(w: np.ndarray, per: int) -> np.ndarray:
    """Grouped value heads [k0: v0 v1, k1: v0 v1] (rows of `per`) -> tiled [k0v0, k1v0, k0v1, k1v1]."""
    return w.reshape(2, 2, per, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape)


def test_qwen35moe_tensors_and_metadata():
    tiny = zoo().get("qwen35moe")
    r = GGUFReader(tiny.gguf("f32"))
    assert _field(r, "general.architecture") == "qwen35moe"
    keys = {"ssm.conv_kernel": 4, "ssm.state_size": 32, "ssm.group_count": 2, "ssm.time_step_rank": 4,
            "ssm.inner_size": 128, "rope.dimension_count": 16, "rope.dimension_sections": [2, 1, 1, 0],
            "attention.recurrent_layers": [True, True, True, False]}
    assert {k: _field(r, f"qwen35moe.{k}") for k in keys} == keys
    assert "qwen35moe.feed_forward_length" not in r.fields
    t = {x.name: x.data for x in r.tensors}
    la = tiny.model.model.layers[0].linear_attn
    hf = {n: p.detach().numpy() for n, p in la.named_parameters()}
    qkv = hf["in_proj_qkv.weight"]
    np.testing.assert_array_equal(t["blk.0.attn_qkv.weight"], np.concatenate([qkv[:128], _tiled(qkv[128:], 32)]))
    np.testing.assert_array_equal(t["blk.0.attn_gate.weight"], _tiled(hf["in_proj_z.weight"], 32))
    np.testing.assert_array_equal(t["blk.0.ssm_beta.weight"], _tiled(hf["in_proj_b.weight"], 1))
    np.testing.assert_array_equal(t["blk.0.ssm_alpha.weight"], _tiled(hf["in_proj_a.weight"], 1))
    np.testing.assert_allclose(t["blk.0.ssm_a"], _tiled(-np.exp(hf["A_log"]), 1), rtol=1e-6)
    np.testing.assert_array_equal(t["blk.0.ssm_dt.bias"], _tiled(hf["dt_bias"], 1))
    conv = hf["conv1d.weight"][:, 0]
    np.testing.assert_array_equal(t["blk.0.ssm_conv1d.weight"], np.concatenate([conv[:128], _tiled(conv[128:], 32)]))
    np.testing.assert_array_equal(t["blk.0.ssm_out.weight"], _tiled(hf["out_proj.weight"].T, 32).T)
    assert "blk.0.ssm_ba.weight" not in t and "blk.3.attn_q.weight" in t


def test_qwen35moe_default_sections_and_bad_sections(tmp_path):
    tiny = zoo().get("qwen35moe")
    hf = tmp_path / "hf"
    shutil.copytree(tiny.hf_dir, hf)
    cfg = json.loads((hf / "config.json").read_text())
    del cfg["rope_parameters"]["mrope_section"]
    (hf / "config.json").write_text(json.dumps(cfg))
    convert(hf, tmp_path / "a.gguf", TypePolicy.from_args(outtype="f32"))
    assert _field(GGUFReader(tmp_path / "a.gguf"), "qwen35moe.rope.dimension_sections") == [11, 11, 10, 0]
    cfg["rope_parameters"]["mrope_section"] = [1, 2, 3, 4, 5]
    (hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="mrope_section=.*up to 4"):
        convert(hf, tmp_path / "b.gguf", TypePolicy.from_args(outtype="f32"))
