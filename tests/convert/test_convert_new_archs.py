"""Converting DeepSeek-V3 (-> deepseek2) and gpt-oss (-> gpt-oss): the tensors llama.cpp's graphs
expect, with the source's values, and the refusals of what GGUF cannot express."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from gguf import GGUFReader

from converters import ConversionError, TypePolicy, convert
from tests.fixtures.tiny import zoo


def _tensors(path) -> dict[str, object]:
    return {t.name: t for t in GGUFReader(path).tensors}


def _array(t) -> np.ndarray:
    return np.array(t.data).reshape([int(d) for d in reversed(t.shape)])


def test_deepseek2_tensors_and_values():
    tiny = zoo().get("deepseek3")
    cfg, layers = tiny.model.config, tiny.model.model.layers
    tensors = _tensors(tiny.gguf("f32"))
    H, L, N, V = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.v_head_dim
    assert not any("attn_kv_b" in n for n in tensors)
    kv_b = layers[1].self_attn.kv_b_proj.weight.detach().numpy().reshape(H, N + V, L)
    assert np.array_equal(_array(tensors["blk.1.attn_k_b.weight"]), kv_b[:, :N].transpose(0, 2, 1))  # [H, L, N]
    assert np.array_equal(_array(tensors["blk.1.attn_v_b.weight"]), kv_b[:, N:])  # [H, V, L]
    assert "blk.0.ffn_gate.weight" in tensors and "blk.0.ffn_gate_inp.weight" not in tensors  # the dense lead
    bias = tensors["blk.2.exp_probs_b.bias"]
    assert bias.tensor_type.name == "F32"
    assert np.array_equal(_array(bias).reshape(-1), layers[2].mlp.gate.e_score_correction_bias.numpy())
    assert "blk.1.ffn_up_shexp.weight" in tensors


def test_deepseek_v2_tensors_and_metadata():
    """V2 without query LoRA: one `attn_q`; no selection bias; softmax gating and V2's groups."""
    tiny = zoo().get("deepseek2")
    layers = tiny.model.model.layers
    reader = GGUFReader(tiny.gguf("f32"))
    tensors = {t.name: t for t in reader.tensors}
    assert np.array_equal(_array(tensors["blk.1.attn_q.weight"]), layers[1].self_attn.q_proj.weight.detach().numpy())
    assert not any(("attn_q_a" in n or "exp_probs_b" in n) for n in tensors)
    fields = {f.name: f.contents() for f in reader.fields.values()}
    assert fields["deepseek2.expert_gating_func"] == 1  # softmax
    assert (fields["deepseek2.expert_group_count"], fields["deepseek2.expert_group_used_count"]) == (4, 1)
    assert fields["deepseek2.expert_weights_scale"] == 2.0 and "deepseek2.attention.q_lora_rank" not in fields


def test_deepseek_v2_unknown_topk_method_is_refused(tmp_path):
    tiny = zoo().get("deepseek2")
    folder = tmp_path / "hf"
    shutil.copytree(tiny.hf_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["topk_method"] = "noaux_tc"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="topk_method 'noaux_tc'"):
        convert(folder, tmp_path / "out.gguf", TypePolicy.from_args(outtype="f32"))


def test_gpt_oss_tensors_and_values():
    tiny = zoo().get("gptoss")
    tensors = _tensors(tiny.gguf(None))  # q8_0 attention, q4_k experts: biases and sinks stay F32
    experts = tiny.model.model.layers[3].mlp.experts
    for part, pick in (("gate", 0), ("up", 1)):
        t = tensors[f"blk.3.ffn_{part}_exps.bias"]
        assert t.tensor_type.name == "F32"
        assert np.array_equal(_array(t), experts.gate_up_proj_bias.detach().float().numpy()[:, pick::2])
    assert np.array_equal(_array(tensors["blk.3.ffn_down_exps.bias"]), experts.down_proj_bias.detach().float().numpy())
    assert tensors["blk.3.ffn_gate_exps.weight"].tensor_type.name == "Q4_K"
    sinks = tensors["blk.0.attn_sinks.weight"]
    assert np.array_equal(_array(sinks).reshape(-1), tiny.model.model.layers[0].self_attn.sinks.detach().numpy())
    assert {"blk.0.attn_output.bias", "blk.0.post_attention_norm.weight", "blk.0.ffn_gate_inp.bias"} <= set(tensors)


@pytest.mark.parametrize("key, change, words", [
    ("deepseek3", {"quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}}, "static"),
    ("gptoss", {"quantization_config": {"quant_method": "awq"}}, "'awq'"),
    ("gptoss", {"swiglu_limit": 10.0}, "swiglu_limit=10.0"),
    ("gptoss", {"layer_types": ["full_attention"] * 3}, "layer_types"),  # one per layer (any pattern: written)
    ("gptoss", {"layer_types": ["chunked_attention"] * 4}, "layer_types"),
    ("minimax", {"scoring_func": "softmax"}, "scoring_func 'softmax'"),
    ("minimax", {"rotary_dim": 63}, "rotary_dim 63"),
    ("llama4", {"no_rope_layers": [1, 0, 1, 1]}, "no_rope_layers"),
    ("llama4", {"moe_layers": [0, 1]}, "moe_layers"),
    ("llama4", {"use_qk_norm": False}, "use_qk_norm"),
    ("llama4", {"attn_temperature_tuning": False}, "attn_temperature_tuning"),
    ("llama4", {"layer_types": ["full_attention", "chunked_attention", "chunked_attention", "full_attention"]},
     "layer_types"),
])
def test_unsupported_configs_are_refused(tmp_path, key, change, words):
    tiny = zoo().get(key)
    src = tmp_path / "hf"
    shutil.copytree(tiny.hf_dir, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ConversionError, match="config.json") as err:
        convert(src, tmp_path / "out.gguf", TypePolicy.from_args(outtype="f32"))
    assert words in str(err.value)
    assert not (tmp_path / "out.gguf").exists()


def test_minimax_m2_tensors_and_metadata():
    """Full-width q/k norms, the selection bias as F32 `exp_probs_b.bias`, rope.dimension_count =
    rotary_dim, sigmoid gating; no shared expert."""
    tiny = zoo().get("minimax")
    layer = tiny.model.model.layers[1]
    reader = GGUFReader(tiny.gguf(None))
    tensors = {t.name: t for t in reader.tensors}
    k_norm = layer.self_attn.k_norm.weight.detach().numpy()  # [Hkv*hd]
    assert np.array_equal(_array(tensors["blk.1.attn_k_norm.weight"]).reshape(-1), k_norm)
    assert _array(tensors["blk.1.attn_q_norm.weight"]).size == 4 * 64
    bias = tensors["blk.1.exp_probs_b.bias"]
    assert bias.tensor_type.name == "F32"
    assert np.array_equal(_array(bias).reshape(-1), layer.mlp.e_score_correction_bias.numpy())
    assert tensors["blk.1.ffn_up_exps.weight"].tensor_type.name == "Q4_K" and not any("shexp" in n for n in tensors)
    fields = {f.name: f.contents() for f in reader.fields.values()}
    assert fields["general.architecture"] == "minimax-m2"
    assert fields["minimax-m2.rope.dimension_count"] == 32 and fields["minimax-m2.attention.key_length"] == 64
    assert fields["minimax-m2.expert_gating_func"] == 2  # sigmoid
    assert fields["minimax-m2.expert_feed_forward_length"] == 256


def test_minimax_m2_skips_multi_token_prediction_layers(tmp_path):
    """Tensors of layers past num_hidden_layers (the released checkpoints' MTP modules) are left
    out, as llama.cpp's converter does; a missing selection bias is named."""
    from safetensors.numpy import load_file, save_file
    tiny = zoo().get("minimax")
    src = tmp_path / "hf"
    shutil.copytree(tiny.hf_dir, src)
    tensors = load_file(src / "model.safetensors")
    extra = {k.replace("layers.1.", "layers.2."): v for k, v in tensors.items() if ".layers.1." in k}
    save_file({**tensors, **extra}, src / "model.safetensors", metadata={"format": "pt"})
    planned = convert(src, tmp_path / "out.gguf", TypePolicy.from_args(outtype="f32"))
    assert not any(p.name.startswith("blk.2.") for p in planned) and any(p.name.startswith("blk.1.") for p in planned)
    del tensors["model.layers.0.block_sparse_moe.e_score_correction_bias"]
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConversionError, match="e_score_correction_bias for blk.0.exp_probs_b.bias"):
        convert(src, tmp_path / "out2.gguf", TypePolicy.from_args(outtype="f32"))
