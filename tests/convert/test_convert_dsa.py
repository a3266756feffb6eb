"""Converting DeepSeek-V3.2 (-> deepseek32) and GLM-5 (-> glm-dsa): the indexer's tensors and keys as
llama.cpp's converter writes them (its head weights in F32 whatever the type asked; GLM-5's
indexer types, no indexer on its shared layers), the checks on what llama.cpp cannot run, and
the multi-token-prediction layer: kept by both converters, the same tensors, and left out of
Strata's trunk (as llama.cpp's main graph leaves it), its tensors kept apart on the model."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from gguf import GGUFReader

import strata
from converters import ConversionError, TypePolicy, convert
from tests.convert.test_glm4moe import _array
from tests.fixtures.rewrite import rewrite_checkpoint
from tests.fixtures.tiny import GGUF_ARCH, llama_cpp_source, zoo
from tests.models.helpers import REL_TOL, Bare, rel_err

KEYS = ("deepseek32", "glmdsa")


def _with_mtp_layer(tiny, folder) -> int:
    """A copy of the checkpoint with an MTP layer after the trunk, as DeepSeek and GLM ship it: a
    copy of the trunk's layer 2 (one with an indexer) plus the MTP projections. Returns its index."""
    n = tiny.model.config.num_hidden_layers

    def add(tensors: dict) -> None:
        D = tensors["model.norm.weight"].shape[0]
        for name in [k for k in tensors if k.startswith("model.layers.2.")]:
            tensors[name.replace("layers.2.", f"layers.{n}.")] = tensors[name].clone()
        g = torch.Generator().manual_seed(0)
        tensors[f"model.layers.{n}.eh_proj.weight"] = torch.randn(D, 2 * D, generator=g)
        for norm in ("enorm", "hnorm", "shared_head.norm"):
            tensors[f"model.layers.{n}.{norm}.weight"] = torch.ones(D)

    rewrite_checkpoint(tiny.hf_dir, folder, {"num_nextn_predict_layers": 1}, add)
    return n


def test_deepseek32_indexer_tensors_and_metadata():
    tiny = zoo().get("deepseek32")
    cfg, ix = tiny.model.config, tiny.model.model.layers[1].self_attn.indexer
    reader = GGUFReader(tiny.gguf(None))  # default types: Q8_0 attention, Q4_K experts
    fields = {f.name: f.contents() for f in reader.fields.values()}
    tensors = {t.name: t for t in reader.tensors}
    keys = {"head_count": cfg.index_n_heads, "key_length": cfg.index_head_dim, "top_k": cfg.index_topk}
    assert {k: fields[f"deepseek32.attention.indexer.{k}"] for k in keys} == keys
    assert fields["deepseek32.expert_gating_func"] == 2 and fields["deepseek32.attention.q_lora_rank"] == 64
    shapes = {"attn_q_b": [64, 1024], "attn_k": [256, 64], "k_norm": [64], "proj": [256, 16]}
    assert {k: tensors[f"blk.1.indexer.{k}.weight"].shape.tolist() for k in shapes} == shapes
    assert tensors["blk.1.indexer.proj.weight"].tensor_type.name == "F32"  # as llama.cpp's converter keeps it
    assert tensors["blk.1.indexer.attn_k.weight"].tensor_type.name == "Q8_0"
    assert np.array_equal(_array(tensors["blk.1.indexer.proj.weight"]), ix.weights_proj.weight.detach().numpy())
    assert np.array_equal(_array(tensors["blk.1.indexer.k_norm.bias"]), ix.k_norm.bias.detach().numpy())


@pytest.mark.parametrize("change, message", [({"q_lora_rank": None}, "q_lora_rank is null"),
                                             ({"index_head_dim": 96}, "index_head_dim=96")])
def test_deepseek32_refuses_what_llama_cpp_cannot_run(tmp_path, change, message):
    tiny = zoo().get("deepseek32")
    rewrite_checkpoint(tiny.hf_dir, tmp_path / "hf", change)
    with pytest.raises(ConversionError, match=message):
        convert(tmp_path / "hf", tmp_path / "out.gguf", TypePolicy.from_args(outtype="f32"))


def test_glm_dsa_indexer_types_and_shared_layers():
    tiny = zoo().get("glmdsa")
    reader = GGUFReader(tiny.gguf("f32"))
    assert reader.fields["glm-dsa.attention.indexer.types"].contents() == [True, False, True, False]
    names = {t.name for t in reader.tensors}
    assert "blk.2.indexer.attn_k.weight" in names and not any(n.startswith("blk.1.indexer") for n in names)
    assert reader.fields["glm-dsa.rope.dimension_count"].contents() == 32


@pytest.mark.parametrize("key", KEYS)
def test_strata_converter_keeps_the_mtp_layer(tmp_path, key):
    """The MTP layer is written as llama.cpp's converter writes it (block_count n + 1,
    nextn_predict_layers 1, blk.n.nextn.*, its indexer and experts), Strata opens the file and runs
    the trunk with transformers' logits; without its tensors (transformers' own save) none is written."""
    tiny = zoo().get(key)
    n, arch = _with_mtp_layer(tiny, tmp_path / "hf"), GGUF_ARCH[key]
    out = tmp_path / "out.gguf"
    convert(tmp_path / "hf", out, TypePolicy.from_args(outtype="f32"))
    reader = GGUFReader(out)
    assert reader.fields[f"{arch}.block_count"].contents() == n + 1
    assert reader.fields[f"{arch}.nextn_predict_layers"].contents() == 1
    names = {t.name for t in reader.tensors}
    assert {f"blk.{n}.nextn.eh_proj.weight", f"blk.{n}.nextn.shared_head_norm.weight", f"blk.{n}.ffn_gate_exps.weight",
            f"blk.{n}.indexer.attn_k.weight", f"blk.{n}.exp_probs_b.bias"} <= names
    with strata.gguf.open_model(out) as mf:
        assert (mf.hparams.n_layers, mf.hparams.n_layers_nextn) == (n, 1)
        assert f"blk.{n}.nextn.eh_proj.weight" in mf.nextn
    ids = tiny.prompt_ids(24)
    assert rel_err(Bare(out).forward(ids, 0), tiny.hf_logits(ids)) <= REL_TOL
    rewrite_checkpoint(tiny.hf_dir, tmp_path / "plain", {"num_nextn_predict_layers": 1})
    convert(tmp_path / "plain", tmp_path / "plain.gguf", TypePolicy.from_args(outtype="f32"))
    plain = GGUFReader(tmp_path / "plain.gguf")
    assert plain.fields[f"{arch}.block_count"].contents() == n and f"{arch}.nextn_predict_layers" not in plain.fields


@pytest.mark.skipif(llama_cpp_source() is None, reason="llama.cpp's source tree not found: set STRATA_LLAMA_CPP_SRC")
@pytest.mark.parametrize("key", KEYS)
def test_llama_cpp_file_with_an_mtp_layer_runs_its_trunk(tmp_path, key):
    """llama.cpp's converter keeps the nextn layer (block_count n + 1, nextn_predict_layers 1):
    Strata opens the file, runs the n trunk layers, keeps the MTP layer's tensors apart, and the
    logits are transformers'."""
    tiny = zoo().get(key)
    n, arch = _with_mtp_layer(tiny, tmp_path / "hf"), GGUF_ARCH[key]
    other = dataclasses.replace(tiny, hf_dir=tmp_path / "hf", root=tmp_path, _files={})
    path = other.llama_cpp_gguf("f32")
    reader = GGUFReader(path)
    assert reader.fields[f"{arch}.block_count"].contents() == n + 1
    assert {f"blk.{n}.nextn.eh_proj.weight", f"blk.{n}.indexer.attn_k.weight"} <= {t.name for t in reader.tensors}
    with strata.gguf.open_model(path) as mf:
        assert (mf.hparams.n_layers, mf.hparams.n_layers_nextn) == (n, 1)
        assert not any(name.startswith(f"blk.{n}.") for name in mf.tensors)  # kept apart, not run
        assert {f"blk.{n}.nextn.eh_proj.weight", f"blk.{n}.ffn_gate_exps.weight"} <= set(mf.nextn)
        assert mf.nextn[f"blk.{n}.nextn.eh_proj.weight"].shape == (256, 512)
    ids = tiny.prompt_ids(24)
    bare = Bare(path)
    assert rel_err(bare.forward(ids, 0), tiny.hf_logits(ids)) <= REL_TOL
    assert len(bare.model.nextn) == 1 and bare.model.nextn.weight(f"blk.{n}.indexer.attn_k.weight").shape == (64, 256)
    # Strata's converter writes the same tensors (names, shapes, types) and keys
    convert(tmp_path / "hf", tmp_path / "strata.gguf", TypePolicy.from_args(outtype="f32"))
    ours = GGUFReader(tmp_path / "strata.gguf")
    assert {t.name: (t.shape.tolist(), t.tensor_type) for t in ours.tensors} == \
        {t.name: (t.shape.tolist(), t.tensor_type) for t in reader.tensors}
    assert ours.fields[f"{arch}.nextn_predict_layers"].contents() == reader.fields[f"{arch}.nextn_predict_layers"].contents()
