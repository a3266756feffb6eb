"""Converting GLM-4.5 (-> glm4moe): the tensors and keys llama.cpp's graph reads, GLM-4.5-Air's
form without q/k norms, and the multi-token-prediction layer: skipped by Strata's converter,
kept by llama.cpp's and then left out of Strata's trunk (as llama.cpp's main graph leaves it)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from gguf import GGUFReader

import strata
from converters import TypePolicy, convert
from tests.fixtures.rewrite import rewrite_checkpoint
from tests.fixtures.tiny import llama_cpp_source, zoo
from tests.models.helpers import REL_TOL, Bare, rel_err


def _array(t) -> np.ndarray:
    return np.array(t.data).reshape([int(d) for d in reversed(t.shape)])


def _add_mtp_layer(tensors: dict) -> None:
    """Layer 3 as GLM ships its nextn layer: a copy of the last MoE layer plus the MTP projections."""
    D = tensors["model.norm.weight"].shape[0]
    for name in [n for n in tensors if n.startswith("model.layers.2.")]:
        tensors[name.replace("layers.2.", "layers.3.")] = tensors[name].clone()
    g = torch.Generator().manual_seed(0)
    tensors["model.layers.3.eh_proj.weight"] = torch.randn(D, 2 * D, generator=g).to(torch.bfloat16)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        tensors[f"model.layers.3.{norm}.weight"] = torch.ones(D, dtype=torch.bfloat16)


def test_glm4moe_tensors_and_metadata():
    tiny = zoo().get("glm4moe")
    reader = GGUFReader(tiny.gguf("f32"))
    tensors = {t.name: t for t in reader.tensors}
    fields = {f.name: f.contents() for f in reader.fields.values()}
    layers = tiny.model.model.layers
    assert fields["glm4moe.rope.dimension_count"] == 32 and fields["glm4moe.block_count"] == 3  # half of hd 64
    assert (fields["glm4moe.leading_dense_block_count"], fields["glm4moe.expert_shared_count"]) == (1, 1)
    assert fields["glm4moe.expert_gating_func"] == 2 and fields["glm4moe.expert_weights_scale"] == 2.5
    assert fields["glm4moe.expert_weights_norm"] and "glm4moe.nextn_predict_layers" not in fields
    assert "glm4moe.expert_group_count" not in fields  # one group
    bias = tensors["blk.2.exp_probs_b.bias"]
    assert bias.tensor_type.name == "F32"
    assert np.array_equal(_array(bias).reshape(-1), layers[2].mlp.gate.e_score_correction_bias.numpy())
    assert np.array_equal(_array(tensors["blk.1.attn_q.bias"]), layers[1].self_attn.q_proj.bias.detach().numpy())
    assert np.array_equal(_array(tensors["blk.1.attn_k_norm.weight"]), layers[1].self_attn.k_norm.weight.detach().numpy())
    assert {"blk.0.ffn_gate.weight", "blk.0.post_attention_norm.weight", "blk.1.ffn_up_shexp.weight"} <= set(tensors)
    assert not any(n.startswith("blk.0.ffn_gate_inp") or n.startswith("blk.1.ffn_norm") for n in tensors)


def test_glm4moe_groups_are_written_when_there_are_several(tmp_path):
    tiny = zoo().get("glm4moe")
    rewrite_checkpoint(tiny.hf_dir, tmp_path / "hf", {"n_group": 4, "topk_group": 2})
    convert(tmp_path / "hf", tmp_path / "out.gguf", TypePolicy.from_args(outtype="f32"))
    hp = strata.gguf.open_model(tmp_path / "out.gguf").hparams
    assert (hp.n_expert_groups, hp.n_expert_groups_used) == (4, 2)


def test_glm4moe_air_without_qk_norms_matches_transformers(tmp_path):
    """GLM-4.5-Air's attention (use_qk_norm false): no q/k norm tensors, none applied."""
    tiny = zoo().get("glm4moe")
    rewrite_checkpoint(tiny.hf_dir, tmp_path / "hf", {"use_qk_norm": False},
                       lambda t: [t.pop(n) for n in [n for n in t if n.endswith(("q_norm.weight", "k_norm.weight"))]])
    out = tmp_path / "air.gguf"
    convert(tmp_path / "hf", out, TypePolicy.from_args(outtype="f32"))
    assert not any("_norm" in t.name and "attn_q" in t.name for t in GGUFReader(out).tensors)
    model = tiny.model
    for layer in model.model.layers:
        layer.self_attn.use_qk_norm = False
    try:
        ids = tiny.prompt_ids(24)
        ref = tiny.hf_logits(ids)
    finally:
        for layer in model.model.layers:
            layer.self_attn.use_qk_norm = True
    bare = Bare(out)
    assert all(b.attention.w.q_norm is None for b in bare.model.blocks)
    assert rel_err(bare.forward(ids, 0), ref) <= REL_TOL
    assert rel_err(bare.forward(ids, 0), tiny.hf_logits(ids)) > 100 * REL_TOL  # the norms matter here


def test_strata_converter_skips_the_mtp_layer(tmp_path):
    tiny = zoo().get("glm4moe")
    rewrite_checkpoint(tiny.hf_dir, tmp_path / "hf", {}, _add_mtp_layer)
    convert(tmp_path / "hf", tmp_path / "out.gguf", TypePolicy.from_args(outtype="f32"))
    reader = GGUFReader(tmp_path / "out.gguf")
    assert reader.fields["glm4moe.block_count"].contents() == 3
    assert not any(t.name.startswith("blk.3.") for t in reader.tensors)


@pytest.mark.skipif(llama_cpp_source() is None, reason="llama.cpp's source tree not found: set STRATA_LLAMA_CPP_SRC")
def test_llama_cpp_file_with_an_mtp_layer_runs_its_trunk(tmp_path):
    """llama.cpp's converter keeps the nextn layer (block_count 4, nextn_predict_layers 1): Strata
    runs the 3 trunk layers, the MTP layer's tensors are not part of the model, the logits are
    transformers'."""
    tiny = zoo().get("glm4moe")
    rewrite_checkpoint(tiny.hf_dir, tmp_path / "hf", {}, _add_mtp_layer)
    other = dataclasses.replace(tiny, hf_dir=tmp_path / "hf", root=tmp_path, _files={})
    path = other.llama_cpp_gguf("f32")
    reader = GGUFReader(path)
    assert reader.fields["glm4moe.block_count"].contents() == 4
    assert {"blk.3.nextn.eh_proj.weight", "blk.3.ffn_gate_exps.weight"} <= {t.name for t in reader.tensors}
    with strata.gguf.open_model(path) as mf:
        assert (mf.hparams.n_layers, mf.hparams.n_layers_nextn) == (3, 1)
        assert mf.expert_layers == [1, 2] and not any(n.startswith("blk.3.") for n in mf.tensors)
    ids = tiny.prompt_ids(24)
    assert rel_err(Bare(path).forward(ids, 0), tiny.hf_logits(ids)) <= REL_TOL
