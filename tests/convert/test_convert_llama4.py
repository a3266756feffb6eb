"""Converting Llama4ForCausalLM (-> llama4): llama.cpp's tensor names and keys, the fused
transposed experts split with their values, dense and MoE layers interleaved (the refusals of
what llama.cpp's llama4 graph fixes are in test_convert_new_archs.py's table)."""
from __future__ import annotations

import numpy as np
from gguf import GGUFReader

from tests.fixtures.tiny import zoo


def _array(t) -> np.ndarray:
    return np.array(t.data).reshape([int(d) for d in reversed(t.shape)])


def test_llama4_tensors_values_and_metadata():
    tiny = zoo().get("llama4")
    reader = GGUFReader(tiny.gguf("f32"))
    tensors = {t.name: t for t in reader.tensors}
    fields = {f.name: f.contents() for f in reader.fields.values()}
    cfg, layers = tiny.model.config, tiny.model.model.layers
    experts = layers[1].feed_forward.experts
    gate_up, down = experts.gate_up_proj.detach().numpy(), experts.down_proj.detach().numpy()  # [E, D, 2F], [E, F, D]
    F = cfg.intermediate_size
    assert np.array_equal(_array(tensors["blk.1.ffn_gate_exps.weight"]), gate_up[..., :F].transpose(0, 2, 1))
    assert np.array_equal(_array(tensors["blk.1.ffn_up_exps.weight"]), gate_up[..., F:].transpose(0, 2, 1))
    assert np.array_equal(_array(tensors["blk.1.ffn_down_exps.weight"]), down.transpose(0, 2, 1))
    q = layers[0].self_attn.q_proj.weight.detach().numpy()
    assert np.array_equal(_array(tensors["blk.0.attn_q.weight"]), q)  # no rotary permutation
    assert {"blk.0.ffn_gate.weight", "blk.2.ffn_up.weight", "blk.3.ffn_gate_inp.weight", "blk.3.ffn_up_shexp.weight"} \
        <= set(tensors)
    assert not any(n.startswith(("blk.0.ffn_gate_inp", "blk.2.ffn_gate_exps", "blk.1.ffn_gate.")) for n in tensors)
    assert fields["general.architecture"] == "llama4"
    assert (fields["llama4.interleave_moe_layer_step"], fields["llama4.attention.sliding_window"]) == (2, 8)
    assert (fields["llama4.feed_forward_length"], fields["llama4.expert_feed_forward_length"]) == (512, 256)
    assert fields["llama4.attention.temperature_length"] == 4 and fields["llama4.attention.temperature_scale"] == 1.0
