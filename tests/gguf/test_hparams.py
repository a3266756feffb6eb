"""read_hparams on metadata dicts: defaults, derivations and refusals, without writing files."""
from __future__ import annotations

from pathlib import Path

import pytest

from strata.errors import StrataFormatError
from strata.gguf.hparams import read_hparams

PATH = Path("model.gguf")
SHAPES = {
    "token_embd.weight": (100, 64),
    "blk.0.ffn_gate_exps.weight": (8, 32, 64),
    "blk.0.ffn_up_exps.weight": (8, 32, 64),
    "blk.0.ffn_down_exps.weight": (8, 64, 32),
}


def meta(arch="qwen3moe", **over):
    md = {
        "general.architecture": arch,
        f"{arch}.block_count": 1,
        f"{arch}.context_length": 256,
        f"{arch}.embedding_length": 64,
        f"{arch}.attention.head_count": 4,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{arch}.expert_count": 8,
        f"{arch}.expert_used_count": 2,
    }
    md.update({k.format(arch=arch): v for k, v in over.items()})
    return {k: v for k, v in md.items() if v is not None}


def test_defaults_follow_llama_cpp():
    hp = read_hparams(PATH, meta(), SHAPES)
    assert (hp.vocab_size, hp.n_ff_exp, hp.n_head_kv, hp.head_dim, hp.rope_dim) == (100, 32, 4, 16, 16)
    assert (hp.rope_freq_base, hp.expert_weights_scale, hp.n_shared_experts, hp.n_ff) == (10000.0, 1.0, 0, 0)
    assert (hp.rope_type, hp.expert_weights_norm, hp.expert_gating_func) == ("neox", True, "softmax")


def test_vocab_from_tokenizer_when_no_key_and_no_embedding():
    shapes = {k: v for k, v in SHAPES.items() if k != "token_embd.weight"}
    hp = read_hparams(PATH, {**meta(), "tokenizer.ggml.tokens": ["a", "b", "c"]}, shapes)
    assert hp.vocab_size == 3
    with pytest.raises(StrataFormatError, match="'qwen3moe.vocab_size'"):
        read_hparams(PATH, meta(), shapes)


def test_uniform_per_layer_array_is_one_value():
    assert read_hparams(PATH, meta(**{"{arch}.attention.head_count_kv": [2]}), SHAPES).n_head_kv == 2
    # per-layer counts are read (mimo2), one per block: two for this one-block file is refused
    with pytest.raises(StrataFormatError, match=r"'qwen3moe.attention.head_count_kv'.*one positive count per block \(1\)"):
        read_hparams(PATH, meta(**{"{arch}.attention.head_count_kv": [2, 4]}), SHAPES)


@pytest.mark.parametrize("key, value, message", [
    ("{arch}.block_count", "2", "'qwen3moe.block_count': expected an integer, found '2'"),
    ("{arch}.expert_used_count", 9, "between 1 and expert_count=8, found 9"),
    ("{arch}.expert_count", 0, "'qwen3moe.expert_count': expected > 0"),
    ("{arch}.attention.head_count", 0, "'qwen3moe.attention.head_count': expected > 0"),
    ("{arch}.expert_gating_func", 7, "'qwen3moe.expert_gating_func'"),
    ("{arch}.rope.scaling.type", "warp", "'qwen3moe.rope.scaling.type'"),
    ("{arch}.attention.layer_norm_rms_epsilon", True, "expected a number, found True"),
    ("{arch}.leading_dense_block_count", 2, "between 0 and block_count=1"),
])
def test_bad_values_are_refused(key, value, message):
    with pytest.raises(StrataFormatError, match="model.gguf: .*" + message.replace("(", r"\(").replace(")", r"\)")):
        read_hparams(PATH, meta(**{key: value}), SHAPES)


def test_keys_override_arch_defaults():
    hp = read_hparams(PATH, meta("qwen2moe", **{"{arch}.expert_weights_norm": True,
                                                "{arch}.expert_gating_func": 2}), SHAPES)
    assert (hp.expert_weights_norm, hp.expert_gating_func) == (True, "sigmoid")


def test_dense_llama_has_no_experts():
    md = meta("llama", **{"{arch}.expert_count": None, "{arch}.expert_used_count": None})
    hp = read_hparams(PATH, md, {"token_embd.weight": (100, 64)})
    assert (hp.n_experts, hp.n_experts_used, hp.n_ff_exp, hp.rope_type) == (0, 0, 0, "norm")


def test_gating_table_agrees_with_gguf_py():
    from gguf.constants import ExpertGatingFuncType

    from strata.gguf.hparams import GATING_FUNCS

    for member in ExpertGatingFuncType:  # gguf-py lacks some of llama.cpp's ids, never disagrees on one
        assert GATING_FUNCS[member.value] == member.name.lower()
