"""Converting Laguna (-> laguna): what the file says where the config departs from llama.cpp's fixed
sliding pattern, and the refusals of what GGUF laguna cannot express (llama.cpp's own converter
gives the reference layout: tests/interop/test_laguna_llama_cpp.py)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from gguf import GGUFReader

from converters import ConversionError, TypePolicy, convert
from tests.fixtures.tiny import zoo
from tests.models.helpers import REL_TOL, Bare, rel_err


def _copy(tmp_path, key: str, change: dict):
    src = tmp_path / "hf"
    shutil.copytree(zoo().get(key).hf_dir, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, **change}))
    return src


def test_fixed_pattern_needs_no_pattern_key():
    """The fixture follows llama.cpp's pattern: only the window is written; M.1's form none."""
    fields = {f.name: f.contents() for f in GGUFReader(zoo().get("laguna").gguf(None)).fields.values()}
    assert fields["laguna.attention.sliding_window"] == 8 and "laguna.attention.sliding_window_pattern" not in fields
    assert fields["laguna.attention.head_count"] == [4, 8, 8, 8] and fields["laguna.leading_dense_block_count"] == 1
    assert fields["laguna.rope.dimension_count_swa"] == 64 and fields["laguna.rope.scaling.type"] == "yarn"
    fields = {f.name: f.contents() for f in GGUFReader(zoo().get("lagunam").gguf(None)).fields.values()}
    assert "laguna.attention.sliding_window" not in fields and fields["laguna.attention.head_count"] == [4] * 4


def test_another_sliding_pattern_is_written_and_computed(tmp_path):
    """layer_types other than llama.cpp's pattern: the file carries them (attention.sliding_window_pattern,
    which llama.cpp's loader reads first) and Strata computes transformers' model from it."""
    import transformers
    types = ["full_attention", "full_attention", "sliding_attention", "full_attention"]
    src = _copy(tmp_path, "laguna", {"layer_types": types})
    convert(src, tmp_path / "out.gguf", TypePolicy.from_args(outtype="f32"))
    fields = {f.name: f.contents() for f in GGUFReader(tmp_path / "out.gguf").fields.values()}
    assert fields["laguna.attention.sliding_window_pattern"] == [False, False, True, False]
    bare = Bare(tmp_path / "out.gguf")
    assert [s.attention.window for s in bare.model.specs] == [0, 0, 8, 0]
    model = transformers.LagunaForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    ids = zoo().get("laguna").prompt_ids(24)
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0]
    assert rel_err(bare.forward(ids, 0), want) <= REL_TOL


@pytest.mark.parametrize("key, change, words", [
    ("laguna", {"moe_router_logit_softcapping": 30.0}, "moe_router_logit_softcapping"),
    ("laguna", {"mlp_layer_types": ["dense", "sparse", "dense", "sparse"]}, "mlp_layer_types"),
    ("laguna", {"num_attention_heads_per_layer": [4, 8, 8]}, "num_attention_heads_per_layer"),
    ("laguna", {"num_attention_heads_per_layer": [4, 8, 8, 3]}, "num_key_value_heads=2"),
    ("laguna", {"gating": "per-element"}, "per-element gate"),
    ("lagunam", {"gating": "per-head"}, "per-head gate"),
    ("laguna", {"gating": "sideways"}, "'sideways'"),
    ("laguna", {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                                    "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
     "plain RoPE"),
])
def test_unsupported_configs_are_refused(tmp_path, key, change, words):
    src = _copy(tmp_path, key, change)
    with pytest.raises(ConversionError, match="config.json") as err:
        convert(src, tmp_path / "out.gguf", TypePolicy.from_args(outtype="f32"))
    assert words in str(err.value)
    assert not (tmp_path / "out.gguf").exists()
