"""Converting Llama4ForCausalLM (-> llama4): llama.cpp's tensor names and keys, the fused
transposed experts split with their values, dense and MoE layers interleaved, and the refusals
of what llama.cpp's llama4 graph fixes."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from gguf import GGUFReader

from converters import ConversionError, TypePolicy, convert
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


@pytest.mark.parametrize("change, words", [
    ({"no_rope_layers": [1, 0, 1, 1]}, "no_rope_layers"),
    ({"moe_layers": [0, 1]}, "moe_layers"),
    ({"use_qk_norm": False}, "use_qk_norm"),
    ({"attn_temperature_tuning": False}, "attn_temperature_tuning"),
    ({"layer_types": ["full_attention", "chunked_attention", "chunked_attention", "full_attention"]}, "layer_types"),
])
def test_unsupported_configs_are_refused(tmp_path, change, words):
    tiny = zoo().get("llama4")
    src = tmp_path / "hf"
    shutil.copytree(tiny.hf_dir, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ConversionError, match="config.json") as err:
        convert(src, tmp_path / "out.gguf", TypePolicy.from_args(outtype="f32"))
    assert words in str(err.value)
    assert not (tmp_path / "out.gguf").exists()
