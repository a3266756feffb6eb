"""The architecture registry: one record describes an architecture to the hparams reader, the
model builder and the converter, so an architecture that differs from a known one only in its
metadata is one `register(Arch(...))` away from converting and running."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from gguf import MODEL_TENSOR as MT
from gguf import GGUFReader

import strata
from converters import TypePolicy, convert
from strata import arch
from strata.errors import StrataFormatError
from strata.gguf.hparams import read_hparams
from tests.fixtures.tiny import zoo

CLONE, CLONE_HF = "qwen3moe-clone", "StrataCloneMoeForCausalLM"  # names no real model uses
torch.set_num_threads(1)  # tiny matrices: see tests/models/conftest.py


@pytest.fixture
def clone():
    """Qwen3-MoE under a new GGUF name and HF architecture, registered for one test."""
    record = arch.register(dataclasses.replace(arch.get("qwen3moe"), name=CLONE, hf_architectures=(CLONE_HF,)))
    yield record
    if arch.get(CLONE) is not None:  # a test may have unregistered it already
        arch.unregister(CLONE)


def test_every_converter_name_finds_its_record():
    for name in arch.names():
        record = arch.get(name)
        assert record.name == name
        assert all(arch.for_hf(hf) is record for hf in record.hf_architectures + record.hf_multimodal)
    assert arch.for_hf("MixtralForCausalLM").name == "llama"
    assert arch.names(runs=True) == ["deepseek2", "deepseek32", "glm-dsa", "glm4moe", "gpt-oss", "hy_v3", "laguna",
                                     "llama", "llama4", "mimo2", "minimax-m2", "olmoe", "qwen2moe", "qwen35moe",
                                     "qwen3moe", "qwen3next"]
    assert arch.names(runs=False) == []
    assert arch.for_hf("DeepseekV3ForCausalLM").name == "deepseek2" and arch.for_hf("GptOssForCausalLM").name == "gpt-oss"
    assert arch.get("llama4").hf_multimodal == ("Llama4ForConditionalGeneration",)
    assert arch.for_hf("Qwen3_5MoeForConditionalGeneration").name == "qwen35moe"
    # gguf-py 0.19 has no LAGUNA: the record carries the name, STEP35 the same tensor table
    assert arch.for_hf("LagunaForCausalLM").name == "laguna" and arch.get("laguna").tensors.name == "STEP35"


def test_tensor_names_are_gguf_py_templates():
    assert arch.weight_name(MT.FFN_GATE_EXP, 3) == "blk.3.ffn_gate_exps.weight"
    assert arch.weight_name(MT.ATTN_Q, 0, "bias") == "blk.0.attn_q.bias"
    assert arch.weight_name(MT.TOKEN_EMBD) == "token_embd.weight"
    assert arch.weight_pattern(MT.FFN_DOWN_EXP).match("blk.12.ffn_down_exps.weight")[1] == "12"
    assert (arch.layer_of("blk.7.attn_k.weight"), arch.layer_of("output.weight")) == (7, None)


def test_names_and_hf_names_must_be_new(clone):
    with pytest.raises(ValueError, match="'qwen3moe-clone' is already registered"):
        arch.register(clone)
    with pytest.raises(ValueError, match="StrataCloneMoeForCausalLM already convert to 'qwen3moe-clone'"):
        arch.register(dataclasses.replace(clone, name="another"))
    with pytest.raises(ValueError, match="rope_type 'sideways'"):
        dataclasses.replace(clone, rope_type="sideways")


def test_hparams_defaults_come_from_the_record(clone):
    """Keys absent from the file take the record's defaults, whatever the name."""
    arch.unregister(CLONE)
    arch.register(dataclasses.replace(clone, rope_type="norm", expert_weights_norm=False,
                                      expert_gating_func="sigmoid"))
    md = {"general.architecture": CLONE, f"{CLONE}.block_count": 1, f"{CLONE}.context_length": 64,
          f"{CLONE}.embedding_length": 64, f"{CLONE}.attention.head_count": 4,
          f"{CLONE}.attention.layer_norm_rms_epsilon": 1e-5, f"{CLONE}.expert_count": 8,
          f"{CLONE}.expert_used_count": 2}
    hp = read_hparams(Path("m.gguf"), md, {"token_embd.weight": (100, 64)})
    assert (hp.arch, hp.rope_type, hp.expert_weights_norm, hp.expert_gating_func) == (CLONE, "norm", False, "sigmoid")
    hp = read_hparams(Path("m.gguf"), {**md, f"{CLONE}.expert_weights_norm": True}, {"token_embd.weight": (100, 64)})
    assert hp.expert_weights_norm is True


def test_a_fifth_architecture_is_one_record(clone, tmp_path):
    """A Qwen3-MoE checkpoint relabelled as a new architecture converts and runs through the new
    record alone, with the same logits as the checkpoint converted as qwen3moe."""
    tiny = zoo().get("qwen3moe")
    hf = Path(shutil.copytree(tiny.hf_dir, tmp_path / "hf"))
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "architectures": [CLONE_HF]}))
    out = tmp_path / "clone.gguf"
    convert(hf, out, TypePolicy.from_args(outtype="f32"), name="tiny-clone", n_threads=1)

    md = GGUFReader(out).fields
    assert bytes(md["general.architecture"].parts[-1]).decode() == CLONE
    assert f"{CLONE}.expert_feed_forward_length" in md and "qwen3moe.block_count" not in md

    ids = tiny.prompt_ids(24)
    with strata.load(out, threads=1, n_ctx=64) as model:
        assert model.hparams.arch == CLONE
        got = model.logits(ids)
    with strata.load(tiny.gguf("f32"), threads=1, n_ctx=64) as model:
        want = model.logits(ids)
    assert torch.equal(got, want)
    ref = tiny.hf_logits(ids)
    assert float((got - ref).abs().max() / ref.abs().max()) <= 1e-4  # and both are transformers' logits

    arch.unregister(CLONE)
    with pytest.raises(StrataFormatError, match="'general.architecture'.*'qwen3moe-clone'"):
        strata.load(out, threads=1)


def test_an_architecture_newer_than_gguf_py_keeps_its_name_and_tensors():
    """hy_v3 (which the installed gguf-py lacks) lists llama.cpp's tensors itself beside a stand-in
    architecture: checkpoint names map through the stand-in's table narrowed to that list, and a
    kind the stand-in's table lacks still maps, through gguf-py's own names for it."""
    from gguf.constants import MODEL_ARCH, MODEL_TENSORS

    hy = arch.get("hy_v3")
    assert hy.name == "hy_v3" and arch.tensor_kinds(hy) == hy.tensor_set
    assert arch.tensor_kinds(arch.get("qwen3moe")) == tuple(MODEL_TENSORS[MODEL_ARCH.QWEN3MOE])
    names = arch.tensor_name_map(hy, 4)
    assert names.get_name("model.layers.3.mlp.e_score_correction") == "blk.3.exp_probs_b"
    assert names.get_name("model.layers.1.post_attention_layernorm") == "blk.1.ffn_norm"
    assert names.get_name("model.layers.3.eh_proj") == "blk.3.nextn.eh_proj"
    assert MT.ROPE_FREQS in MODEL_TENSORS[hy.tensors] and names.get_name("rope.freqs") is None  # not hy_v3's
    # GLM-4.5's table names the FFN's pre-norm post_attention_norm and has no ffn_norm: narrowed to
    # hy_v3's list, the checkpoint's post_attention_layernorm is ffn_norm again
    glm_names = arch.tensor_name_map(arch.get("glm4moe"), 2)
    assert glm_names.get_name("model.layers.1.post_attention_layernorm") == "blk.1.post_attention_norm"
    assert MT.FFN_NORM not in MODEL_TENSORS[MODEL_ARCH.GLM4_MOE]
    on_glm = arch.tensor_name_map(dataclasses.replace(hy, tensors=MODEL_ARCH.GLM4_MOE), 2)
    assert on_glm.get_name("model.layers.1.post_attention_layernorm") == "blk.1.ffn_norm"
    assert on_glm.get_name("model.layers.1.self_attn.q_norm") == "blk.1.attn_q_norm"
