"""RoPE frequencies and rotations against transformers' own functions."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.qwen3_moe.modeling_qwen3_moe import apply_rotary_pos_emb

from strata.errors import StrataFormatError
from strata.gguf import RopeScaling, open_model
from strata.models.rope import Rope, rope_frequencies
from tests.fixtures.tiny import zoo


@pytest.fixture(scope="module")
def hparams():
    return open_model(zoo().get("qwen3moe").gguf("f32")).hparams


def _hf_config(rope_parameters: dict) -> transformers.PretrainedConfig:
    return transformers.Qwen3MoeConfig(hidden_size=256, num_attention_heads=4, head_dim=64,
                                       max_position_embeddings=4096, rope_parameters=rope_parameters)


@pytest.mark.parametrize("kind, params", [
    ("linear", dict(factor=4.0)),
    ("yarn", dict(factor=4.0, original_max_position_embeddings=512)),
    ("yarn", dict(factor=8.0, original_max_position_embeddings=1024, beta_fast=16.0, beta_slow=2.0)),
])
def test_scaled_frequencies_match_transformers(hparams, kind, params):
    scaling = RopeScaling(type=kind, factor=params["factor"],
                          original_context_length=params.get("original_max_position_embeddings", 512),
                          yarn_beta_fast=params.get("beta_fast"), yarn_beta_slow=params.get("beta_slow"))
    hp = dataclasses.replace(hparams, rope_freq_base=10000.0, rope_scaling=scaling)
    inv_freq, scale = rope_frequencies(hp)
    ref_inv, ref_scale = ROPE_INIT_FUNCTIONS[kind](_hf_config(dict(rope_type=kind, rope_theta=10000.0, **params)))
    torch.testing.assert_close(inv_freq, ref_inv, rtol=1e-6, atol=0)
    assert scale == pytest.approx(ref_scale, rel=1e-7)


def test_unsupported_scaling_is_a_format_error(hparams):
    hp = dataclasses.replace(hparams, rope_scaling=RopeScaling(type="ntk", factor=2.0))
    with pytest.raises(StrataFormatError, match="ntk"):
        rope_frequencies(hp)


def test_neox_rotation_matches_transformers(hparams):
    rope = Rope(hparams, torch.device("cpu"))
    q, k = torch.randn(9, 4, 64), torch.randn(9, 2, 64)  # [T, H, hd]
    cos, sin = rope.cos_sin(torch.arange(3, 12), torch.float32)  # [T, hd/2]
    cos2, sin2 = torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None]  # [1, T, hd]
    ref_q, ref_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos2, sin2)
    torch.testing.assert_close(rope.apply(q, cos, sin), ref_q[0].transpose(0, 1), rtol=0, atol=1e-6)
    torch.testing.assert_close(rope.apply(k, cos, sin), ref_k[0].transpose(0, 1), rtol=0, atol=1e-6)


def test_norm_rotation_is_neox_on_interleaved_features(hparams):
    """NORM rotates pairs (2i, 2i+1); NEOX rotates (i, i + hd/2): the same map up to a permutation."""
    norm = Rope(dataclasses.replace(hparams, rope_type="norm"), torch.device("cpu"))
    neox = Rope(hparams, torch.device("cpu"))
    x = torch.randn(5, 3, 64)
    cos, sin = norm.cos_sin(torch.arange(5), torch.float32)
    perm = torch.cat((torch.arange(0, 64, 2), torch.arange(1, 64, 2)))  # interleaved -> halves
    torch.testing.assert_close(norm.apply(x, cos, sin)[..., perm], neox.apply(x[..., perm], cos, sin))


def test_partial_rotary_passes_the_rest_through(hparams):
    rope = Rope(dataclasses.replace(hparams, rope_dim=32), torch.device("cpu"))
    x = torch.randn(4, 2, 64)
    out = rope.apply(x, *rope.cos_sin(torch.arange(1, 5), torch.float32))
    assert torch.equal(out[..., 32:], x[..., 32:])
    assert not torch.allclose(out[..., :32], x[..., :32])


@pytest.mark.parametrize("kind, params", [
    ("yarn", dict(factor=4.0, original_max_position_embeddings=512, attention_factor=1.5)),
    ("longrope", dict(original_max_position_embeddings=512, attention_factor=1.2,
                      short_factor=[1.0 + 0.1 * i for i in range(32)], long_factor=[2.0 + i for i in range(32)])),
])
def test_attention_factors_and_longrope_match_transformers(hparams, kind, params):
    """yarn_attn_factor replaces YaRN's 1 + 0.1 ln factor (transformers' attention_factor); longrope
    divides by the long factors (the context exceeds the original) and scales cos/sin by attn_factor."""
    long = torch.tensor(params.get("long_factor", [1.0] * 32))
    scaling = RopeScaling(type=kind, factor=params.get("factor", 1.0), original_context_length=512,
                          yarn_attn_factor=params["attention_factor"] if kind == "yarn" else None,
                          attn_factor=params["attention_factor"] if kind == "longrope" else None)
    hp = dataclasses.replace(hparams, rope_freq_base=10000.0, rope_scaling=scaling)
    inv_freq, scale = rope_frequencies(hp, long if kind == "longrope" else None)
    cfg = _hf_config(dict(rope_type=kind, rope_theta=10000.0, **params))
    ref_inv, ref_scale = ROPE_INIT_FUNCTIONS[kind](cfg, seq_len=4096) if kind == "longrope" else \
        ROPE_INIT_FUNCTIONS[kind](cfg)
    torch.testing.assert_close(inv_freq, ref_inv, rtol=1e-6, atol=0)
    assert scale == pytest.approx(ref_scale, rel=1e-7)


def test_rope_attn_factor_scales_every_type(hparams):
    """llama.cpp multiplies cos/sin by rope.scaling.attn_factor whatever the scaling type."""
    for kind in ("none", "linear"):
        hp = dataclasses.replace(hparams, rope_scaling=RopeScaling(type=kind, factor=2.0, attn_factor=0.75))
        assert rope_frequencies(hp)[1] == 0.75
