"""Laguna (`laguna`) against transformers' LagunaForCausalLM on the bar of the other families, on two
tiny models: XS.2's form ("laguna": 4 query heads on the full layer 0, 8 on the sliding layers 1-3
with a window of 8 as llama.cpp lays them out, YaRN on the full layer and plain RoPE of their own on
the sliding ones, a per-head softplus output gate) and M.1's ("lagunam": every layer full, one gate
per feature, two dense layers); and what only Laguna has: the per-layer heads, the sliding layers'
own RoPE and the gate each matter, and every path (float, packed per call, the fused decode step,
the decode program with its second RoPE table, the memories, batching) gives the same.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from strata.gguf import RopeScaling
from strata.models.rope import Rope
from tests.fixtures.rewrite import V, rewrite
from tests.fixtures.tiny import zoo

from .helpers import (REL_TOL, Bare, check_batch_of_two, check_chunked_prefill, check_generate_batch, check_greedy_32,
                      check_packed_every_memory, check_prefill_and_decode, load, rel_err, tiny_fixture)

tiny = tiny_fixture("laguna")


@pytest.fixture(scope="module", params=["laguna", "lagunam"])
def both(request):
    return zoo().get(request.param)


def test_prefill_and_each_decode_step_match_transformers(both, record_property):
    check_prefill_and_decode(both, record_property, "laguna", 20, 16)


def test_greedy_32_tokens_match_transformers(both):
    check_greedy_32(both)


def test_layers_are_as_llama_cpp_lays_them_out(tiny):
    """Head counts per layer, full attention on layer 0 and the window on 1-3 (llama.cpp's fixed
    pattern, which the fixture's layer_types follow), RoPE on 32 features at 500000 with YaRN on
    the full layer and on all 64 at 10000 unscaled on the sliding ones, one gate per head."""
    bare = Bare(tiny.gguf("f32"))
    hp, cfg = bare.mf.hparams, tiny.model.config
    assert hp.heads == tuple(cfg.num_attention_heads_per_layer) == (4, 8, 8, 8)
    assert hp.swa_layers == (False, True, True, True) and hp.sliding_window == 8
    assert (hp.rope_dim, hp.rope_dim_swa, hp.rope_freq_base, hp.rope_freq_base_swa) == (32, 64, 5e5, 1e4)
    assert hp.rope_scaling.type == "yarn" and hp.n_dense_lead == 1 and hp.n_ff_shexp == 512
    specs = bare.model.specs
    assert [(s.attention.n_head, s.attention.window, s.attention.own_rope, s.attention.out_gate) for s in specs] == \
        [(4, 0, False, "head")] + [(8, 8, True, "head")] * 3
    ropes = [b.attention.rope for b in bare.model.blocks]
    assert ropes[0] is bare.model.rope and ropes[1] is ropes[2] is ropes[3] is not ropes[0]
    assert (ropes[0].rope_dim, ropes[1].rope_dim, ropes[1].scale) == (32, 64, 1.0) and ropes[0].scale > 1.0
    for block, layer in zip(bare.model.blocks, tiny.model.model.layers):
        assert torch.equal(block.attention.w.wg, layer.self_attn.g_proj.weight.detach())
    m = Bare(zoo().get("lagunam").gguf("f32"))
    assert m.mf.hparams.sliding_window == 0 and not m.mf.hparams.heads and m.mf.hparams.n_dense_lead == 2
    assert {(s.attention.window, s.attention.out_gate) for s in m.model.specs} == {(0, "element")}


def test_sliding_layers_rotate_plainly(tiny):
    """The sliding layers' RoPE is their own and unscaled: with the full layers' YaRN on them too
    (llama.cpp's default for other families) the model departs from transformers."""
    ids = tiny.prompt_ids(24)
    bare = Bare(tiny.gguf("f32"))
    hp = bare.mf.hparams
    assert rel_err(bare.forward(ids, 0), tiny.hf_logits(ids)) <= REL_TOL
    scaled = Rope(dataclasses.replace(hp, rope_dim=hp.rope_dim_swa), torch.device("cpu"), None, hp.rope_freq_base_swa)
    plain = Rope(dataclasses.replace(hp, rope_dim=hp.rope_dim_swa, rope_scaling=RopeScaling()), torch.device("cpu"),
                 None, hp.rope_freq_base_swa)
    assert torch.equal(plain.inv_freq, bare.model.blocks[1].attention.rope.inv_freq)
    other = Bare(tiny.gguf("f32"))
    for block in other.model.blocks[1:]:
        block.attention.rope = scaled
    assert rel_err(other.forward(ids, 0), tiny.hf_logits(ids)) > 100 * REL_TOL


def test_the_output_gate_matters(both):
    ids = both.prompt_ids(16)
    bare = Bare(both.gguf("f32"))
    for block in bare.model.blocks:
        block.attention.w.wg = None
    assert rel_err(bare.forward(ids, 0), both.hf_logits(ids)) > 100 * REL_TOL


def test_a_batch_of_two_equals_each_alone(tiny):
    check_batch_of_two(tiny)


def test_chunked_prefill_across_the_window(tiny):
    """Chunks of 5, 1 and 7 tokens over a window of 8: each chunk's sliding layers see the cached
    keys still inside their window, and no older ones."""
    check_chunked_prefill(tiny)


def test_packed_compute_every_memory_and_the_plan(both):
    """Packed compute equals float on the f32 file in every memory; decode runs the decode program
    (every block fused; the sliding layers read its second RoPE table); greedy tokens agree."""
    def plan(m, memory):
        assert m.plan.decode == "program" and all(s is not None for s in m.runner.steps), memory
        program = m.runner.program
        assert [layer.reads_alt for layer in program.layers] == [s.attention.own_rope for s in m.transformer.specs]
        assert any(s.layer.c.g_rows for s in m.runner.steps)

    check_packed_every_memory(both, plan)


def test_generate_batch_equals_each_alone(tiny):
    check_generate_batch(tiny)


def test_default_file_packed_and_tiered(tiny):
    """The default file (Q8_0 attention and gates, Q4_K experts): packed compute picks float's
    tokens on it, and the tiered memory gives direct memory's bytes."""
    ids, prompt = tiny.prompt_ids(40), tiny.prompt_ids(16, seed=21)
    path = tiny.gguf(None)
    with load(path, "float") as ref, load(path, "packed") as direct, load(path, "packed", "tiered") as tiered:
        a, b = ref.logits(ids), direct.logits(ids)
        assert torch.equal(b, tiered.logits(ids))
        assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.95
        assert direct.generate(prompt, temperature=0, max_tokens=16, stop_token_ids=()).token_ids == \
            ref.generate(prompt, temperature=0, max_tokens=16, stop_token_ids=()).token_ids


@pytest.mark.parametrize("key, value, words", [
    ("attention.head_count", ([4, 8, 8], V.ARRAY, V.UINT32), "one positive count per block (4)"),
    ("attention.head_count", ([4, 8, 8, 3], V.ARRAY, V.UINT32), "a divisor of head_count=3"),
    ("rope.dimension_count_swa", (63, V.UINT32), "an even number in 2..head_dim=64"),
    ("attention.head_count", ([4, 4, 8, 8], V.ARRAY, V.UINT32), "'blk.1.attn_q.weight': expected shape [256, 256]"),
])
def test_malformed_files_are_refused_by_name(tiny, tmp_path, key, value, words):
    """Per-layer heads and the sliding layers' rotary features are checked against the file: a
    wrong value names its key, or the tensor whose shape it contradicts."""
    from strata.errors import StrataFormatError
    path = rewrite(tiny.gguf("f32"), tmp_path / "bad.gguf", {f"laguna.{key}": value})
    with pytest.raises(StrataFormatError) as err:
        Bare(path)
    assert str(path) in str(err.value) and words in str(err.value)
