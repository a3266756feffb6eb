"""Hunyuan V3 (`hy_v3`) against transformers' HYV3ForCausalLM on the bar of the other families, on
a tiny model of a dense first layer and two MoE layers (q/k head norms, a sigmoid router whose
selection bias picks but does not weigh, renormalised weights times router_scaling_factor, a
shared expert); what its files hold (the bare `exp_probs_b`, no dense-lead key); packed compute
and the memories; and its multi-token-prediction layer: converted, loaded and kept, never run."""
from __future__ import annotations

import pytest
import torch
from gguf import GGUFReader
from safetensors.torch import load_file

import strata
from converters import ConversionError, TypePolicy, convert
from strata.models import kinds
from strata.models.executor import NativeRouter
from strata.models.layers import FeedForward
from strata.models.moe import MoE, Router
from strata.models.spec import GQA
from tests.fixtures.rewrite import rewrite_checkpoint

from .helpers import REL_TOL, Bare, check_packed_every_memory, packed_decode_error, rel_err, tiny_fixture

tiny = tiny_fixture("hyv3")


def test_layers_are_as_transformers_builds_them(tiny):
    """A dense first layer (no key says so: the tensors do), then MoE layers with a shared expert;
    the router's selection bias, scale and gating, and the per-head q/k norms, from the file."""
    bare, cfg = Bare(tiny.gguf("f32")), tiny.model.config
    hp = bare.mf.hparams
    assert (hp.n_dense_lead, hp.expert_gating_func, hp.expert_weights_norm) == (0, "sigmoid", True)
    assert abs(hp.expert_weights_scale - cfg.router_scaling_factor) < 1e-6 and hp.n_ff_shexp == 256
    assert [type(b.ffn) for b in bare.model.blocks] == [FeedForward, MoE, MoE] and bare.mf.expert_layers == [1, 2]
    for block, layer in zip(bare.model.blocks, tiny.model.model.layers):
        w = block.attention.w
        assert w.qk_norm_per_head and torch.equal(w.q_norm.weight, layer.self_attn.q_norm.weight.detach())  # [hd]
        if isinstance(block.ffn, MoE):
            assert torch.equal(block.ffn.router.selection_bias, layer.mlp.e_score_correction_bias)
            assert block.ffn.shared is not None


def test_router_matches_transformers(tiny):
    """Sigmoid scores, the selection bias choosing but not weighing, renormalised top-k weights
    times router_scaling_factor: transformers' HYV3TopKRouter's experts and weights, through torch
    and the native call; without the bias other experts win."""
    mlp, cfg = tiny.model.model.layers[1].mlp, tiny.model.config
    x = torch.randn(64, cfg.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, want_w, want_ids = mlp.gate(x, mlp.e_score_correction_bias)
    order_w, bias = want_ids.sort(-1), mlp.e_score_correction_bias.detach()
    for cls in (Router, NativeRouter):
        got_w, got_ids = cls(mlp.gate.weight.detach(), cfg.num_experts_per_tok, "sigmoid", True,
                             cfg.router_scaling_factor, selection_bias=bias)(x)
        order_g = got_ids.sort(-1)
        assert torch.equal(order_w.values, order_g.values), cls
        assert torch.allclose(want_w.gather(1, order_w.indices), got_w.gather(1, order_g.indices), atol=1e-6)
    unbiased = Router(mlp.gate.weight.detach(), cfg.num_experts_per_tok, "sigmoid", True, 1.0)(x)[1].sort(-1).values
    assert (unbiased != order_w.values).any(-1).float().mean() > 0.05  # the fixture's bias decides


def test_the_selection_bias_in_the_file_matters(tiny):
    """The bias read from the bare `blk.N.exp_probs_b`: without it the logits depart from transformers'."""
    ids = tiny.prompt_ids(32)
    bare = Bare(tiny.gguf("f32"))
    for block in bare.model.blocks[1:]:
        block.ffn.router.selection_bias = None
    assert rel_err(bare.forward(ids, 0), tiny.hf_logits(ids)) > 10 * REL_TOL


def test_file_holds_what_llama_cpp_reads(tiny):
    reader = GGUFReader(tiny.gguf(None))
    fields = {f.name: f.contents() for f in reader.fields.values()}
    tensors = {t.name: t for t in reader.tensors}
    assert fields["general.architecture"] == "hy_v3" and fields["hy_v3.block_count"] == 3
    assert fields["hy_v3.expert_gating_func"] == 2 and fields["hy_v3.expert_weights_norm"]
    assert abs(fields["hy_v3.expert_weights_scale"] - 2.826) < 1e-6
    assert (fields["hy_v3.expert_feed_forward_length"], fields["hy_v3.expert_shared_feed_forward_length"]) == (256, 256)
    assert "hy_v3.leading_dense_block_count" not in fields and "hy_v3.nextn_predict_layers" not in fields
    assert tensors["blk.1.exp_probs_b"].tensor_type.name == "F32" and "blk.1.exp_probs_b.bias" not in tensors
    assert "blk.0.ffn_gate.weight" in tensors and "blk.0.ffn_gate_inp.weight" not in tensors
    assert tensors["blk.2.ffn_up_shexp.weight"].tensor_type.name == "Q8_0"
    assert tensors["blk.2.ffn_up_exps.weight"].tensor_type.name == "Q4_K"


def test_packed_compute_every_memory_and_the_plan(tiny):
    """Packed compute equals float on the f32 file in every memory; decode runs the decode program
    (every block fused, the dense first layer included); greedy tokens agree."""
    def plan(m, memory):
        assert m.plan.decode == "program" and all(s is not None for s in m.runner.steps), memory

    check_packed_every_memory(tiny, plan)


def test_packed_decode_steps_equal_the_float_path(tiny):
    """Hunyuan V3 needs no layer kind of its own: GQA layers (q/k head norms), the native executor's
    class under packed compute, each decode step within float rounding of the float path."""
    def native_gqa(bare):
        assert {s.attention.kind for s in bare.model.specs} == {GQA}
        assert all(type(b.attention) is kinds.get(GQA).classes["native"] for b in bare.model.blocks)

    assert packed_decode_error(tiny, 24, native_gqa) < 1e-5


def add_mtp_layer(tensors: dict) -> None:
    """Layer 3 as Hy3 ships its MTP layer: a decoder block (a copy of the last MoE layer) with the
    draft head's projections and its final norm."""
    D = tensors["model.norm.weight"].shape[0]
    for name in [n for n in tensors if n.startswith("model.layers.2.")]:
        tensors[name.replace("layers.2.", "layers.3.")] = tensors[name].clone()
    g = torch.Generator().manual_seed(0)
    tensors["model.layers.3.eh_proj.weight"] = (0.05 * torch.randn(D, 2 * D, generator=g)).to(torch.bfloat16)
    for norm in ("enorm", "hnorm", "final_layernorm"):
        tensors[f"model.layers.3.{norm}.weight"] = (1 + 0.1 * torch.randn(D, generator=g)).to(torch.bfloat16)


def test_multi_token_prediction_layer_is_converted_loaded_and_kept(tiny, tmp_path):
    """A checkpoint with an MTP layer: the converter keeps it (block_count 4, nextn_predict_layers
    1, `blk.3.nextn.*`, its experts and bare selection bias); Strata loads the file, keeps the layer
    on the model (the projections' values, the block's tensors) and runs the trunk alone: the
    logits of the file without it, bit for bit, float and packed."""
    hf = rewrite_checkpoint(tiny.hf_dir, tmp_path / "hf", {"num_nextn_predict_layers": 1}, add_mtp_layer)
    out = tmp_path / "mtp.gguf"
    convert(hf, out, TypePolicy.from_args(outtype="f32"), n_threads=1)
    reader = GGUFReader(out)
    fields = {f.name: f.contents() for f in reader.fields.values()}
    names = {t.name for t in reader.tensors}
    assert (fields["hy_v3.block_count"], fields["hy_v3.nextn_predict_layers"]) == (4, 1)
    assert {"blk.3.nextn.eh_proj.weight", "blk.3.nextn.enorm.weight", "blk.3.nextn.hnorm.weight",
            "blk.3.nextn.shared_head_norm.weight", "blk.3.exp_probs_b", "blk.3.ffn_gate_exps.weight",
            "blk.3.attn_q.weight", "blk.3.ffn_up_shexp.weight"} <= names
    source = load_file(next(hf.glob("*.safetensors")))
    ids = tiny.prompt_ids(24)
    for compute in ("float", "packed"):
        with strata.load(out, threads=1, n_ctx=64, compute=compute) as m, \
                strata.load(tiny.gguf("f32"), threads=1, n_ctx=64, compute=compute) as trunk:
            assert m.hparams.n_layers == 3 and len(m.transformer.blocks) == 3
            assert torch.equal(m.logits(ids), trunk.logits(ids))
            nextn = m.transformer.nextn
            assert [b.index for b in nextn.blocks] == [3]
            assert nextn.blocks[0].names == sorted(n for n in names if n.startswith("blk.3."))
            eh_proj = source["model.layers.3.eh_proj.weight"].float()
            assert torch.equal(nextn.weight("blk.3.nextn.eh_proj.weight"), eh_proj)
            assert torch.equal(nextn.weight("blk.3.nextn.shared_head_norm.weight"),
                               source["model.layers.3.final_layernorm.weight"].float())
    with strata.gguf.open_model(out) as mf:
        assert mf.expert_layers == [1, 2]  # the memories hold the trunk's experts only
    with strata.load(tiny.gguf("f32"), threads=1, n_ctx=64, compute="packed") as trunk:
        want = trunk.logits(ids)
    for memory in ("paged", "tiered"):
        with strata.load(out, threads=1, n_ctx=64, compute="packed", memory=memory) as m:
            assert torch.equal(m.logits(ids), want), memory


def test_config_without_the_mtp_tensors_writes_none(tiny, tmp_path):
    hf = rewrite_checkpoint(tiny.hf_dir, tmp_path / "hf", {"num_nextn_predict_layers": 1})
    out = tmp_path / "trunk.gguf"
    convert(hf, out, TypePolicy.from_args(outtype="f32"), n_threads=1)
    fields = {f.name: f.contents() for f in GGUFReader(out).fields.values()}
    assert fields["hy_v3.block_count"] == 3 and "hy_v3.nextn_predict_layers" not in fields


@pytest.mark.parametrize("change, match", [
    ({"attention_bias": True}, "attention_bias=true is not supported"),
    ({"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types .*expected 3 entries"),
    ({"mlp_layer_types": ["dense", "sparse", "moe"]}, "expected 3 entries of 'dense' or 'sparse'"),
])
def test_converter_refuses_what_llama_cpp_cannot_run(tiny, tmp_path, change, match):
    hf = rewrite_checkpoint(tiny.hf_dir, tmp_path / "hf", change)
    with pytest.raises(ConversionError, match=match):
        convert(hf, tmp_path / "out.gguf", TypePolicy.from_args(outtype="f32"), n_threads=1)


def test_a_layer_marked_sparse_without_experts_is_named(tiny, tmp_path):
    """mlp_layer_types says layer 0 is sparse but the checkpoint has a dense FFN there: the missing
    experts are named."""
    hf = rewrite_checkpoint(tiny.hf_dir, tmp_path / "hf", {"mlp_layer_types": ["sparse", "sparse", "sparse"]})
    with pytest.raises(ConversionError, match="no expert tensors for layer 0"):
        convert(hf, tmp_path / "out.gguf", TypePolicy.from_args(outtype="f32"), n_threads=1)


def test_transformers_own_layout_converts_to_the_same_file(tiny, tmp_path):
    """The released names (`mlp.router.gate`, `mlp.expert_bias`, `mlp.shared_mlp`, per-expert
    weights: what the fixture saves) and transformers' own (`mlp.gate`, `mlp.e_score_correction_bias`,
    `mlp.shared_experts`, fused experts) give the same tensors."""
    import copy

    from tests.convert.fixtures import save_checkpoint
    hf = save_checkpoint(copy.deepcopy(tiny.model), tiny.spec, tiny.tokenizer, tmp_path / "hf", fused=True)
    names = set(load_file(next(hf.glob("*.safetensors"))))
    assert {"model.layers.1.mlp.e_score_correction_bias", "model.layers.1.mlp.experts.gate_up_proj"} <= names
    out = tmp_path / "fused.gguf"
    convert(hf, out, TypePolicy.from_args(outtype="f32"), n_threads=1)
    ours = {t.name: t.data.tobytes() for t in GGUFReader(out).tensors}
    assert ours == {t.name: t.data.tobytes() for t in GGUFReader(tiny.gguf("f32")).tensors}


def test_routing_statistics_and_calibration_count_the_trunk_alone(tiny, tmp_path):
    """With an MTP layer kept, routing statistics (`--routing-stats`) and calibration (`--calib`,
    which records the routing it sees) are the trunk's expert layers' (the file's expert layers
    as Strata reads it): both files load and route by them."""
    import numpy as np

    from converters import CalibOptions
    from strata.gguf.routing import save_routing_npz
    from strata.synth.tokenizer import corpus
    hf = rewrite_checkpoint(tiny.hf_dir, tmp_path / "hf", {"num_nextn_predict_layers": 1}, add_mtp_layer)
    save_routing_npz(tmp_path / "routing.npz", np.arange(16).reshape(2, 8) + 1, 100)
    text = tmp_path / "calib.txt"
    text.write_text(" ".join(corpus(40)))
    stats, calibrated = tmp_path / "stats.gguf", tmp_path / "calib.gguf"
    convert(hf, stats, TypePolicy(), n_threads=1, routing_stats=tmp_path / "routing.npz")
    convert(hf, calibrated, TypePolicy(), n_threads=1, calib=CalibOptions(str(text), 64, 32, progress=False))
    ids = tiny.prompt_ids(16)
    for path in (stats, calibrated):
        with strata.gguf.open_model(path) as mf:
            assert mf.expert_layers == [1, 2] and mf.hparams.n_layers_nextn == 1
        with strata.load(path, threads=1, n_ctx=64) as m:
            assert len(m.transformer.nextn) == 1
            assert float((m.logits(ids).argmax(-1) == tiny.hf_logits(ids).argmax(-1)).float().mean()) >= 0.9
