"""Qwen3-Next (`qwen3next`) against transformers' Qwen3NextForCausalLM on the bar of the other
families, on a tiny model of three gated DeltaNet layers and one gated full-attention layer; and
what only it has: the per-sequence recurrent state (per slot, reset at position 0, zeroed when the
slot is freed, right under batching and chunked prefill), every path (float, packed per-call, the
memories, batching, the engine) giving the same, and the runtime plan saying why decode runs the
decode program (every block fused, experts in place)."""
from __future__ import annotations

from strata.models.deltanet import GatedAttention, GatedDeltaNet

from .helpers import (REL_TOL, Bare, check_packed_every_memory, load, rel_err, tiny_fixture)

tiny = tiny_fixture("qwen3next")


def test_layers_are_as_transformers_builds_them(tiny):
    bare = Bare(tiny.gguf("f32"))
    hp = bare.mf.hparams
    assert hp.recurrent_layers == (True, True, True, False) and hp.rope_dim == 16
    assert (hp.ssm.n_k_heads, hp.ssm.n_v_heads, hp.ssm.head_k_dim, hp.ssm.conv_kernel) == (2, 4, 32, 4)
    kinds = [type(b.attention) for b in bare.model.blocks]
    assert kinds == [GatedDeltaNet] * 3 + [GatedAttention]
    conv, ssm = bare.cache.layer(0)
    assert conv.shape == (1, 3, 256) and ssm.shape == (1, 4, 32, 32)
    assert not bare.cache.prefix_cache  # a recurrent state cannot be rebuilt from cached blocks


def test_a_new_sequence_in_a_used_slot_starts_from_zero(tiny):
    """The state is per slot: a sequence that reuses a slot (position 0 again) is not disturbed by
    the previous one, and freeing the slot zeroes its rows."""
    a, b = tiny.prompt_ids(9, seed=1), tiny.prompt_ids(9, seed=2)
    bare = Bare(tiny.gguf("f32"))
    bare.forward(a, 0)
    assert rel_err(bare.forward(b, 0), tiny.hf_logits(b)) <= REL_TOL
    bare.cache.free(0)
    assert all(bare.cache.layer(i)[1].abs().sum() == 0 for i in range(3))


def test_the_state_matters(tiny):
    """Without the carried state (reset each call) decode departs from transformers."""
    ids = tiny.prompt_ids(12)
    bare = Bare(tiny.gguf("f32"))
    bare.forward(ids[:8], 0)
    for i in range(3):
        bare.cache.layer(i)[1].zero_()
    assert rel_err(bare.forward(ids[8:], 8), tiny.hf_logits(ids)[8:]) > 10 * REL_TOL


def test_packed_compute_every_memory_and_the_plan(tiny):
    """Packed compute equals float on the f32 file in every memory; decode runs the decode program
    (every block fused; on the CPU the tiered memory is served by the paged one) and the plan says
    so; greedy tokens agree."""
    def plan(m, memory):
        assert m.plan.decode == "program" and all(s is not None for s in m.runner.steps), memory

    check_packed_every_memory(tiny, plan)


def test_n_choices_fork_the_recurrent_state(tiny):
    """n > 1 prefills the prompt once and forks it: each choice takes a copy of the prompt's
    recurrent state, so the choices equal separate requests with the same seeds."""
    prompt = tiny.prompt_ids(13, seed=5)
    with load(tiny.gguf("f32"), "packed", max_batch=4) as m:
        before = m.engine.n_prefilled
        choices = m.generate(prompt, n=3, temperature=1.0, seed=9, max_tokens=10, stop_token_ids=())
        assert m.engine.n_prefilled - before == len(prompt)
        alone = [m.generate(prompt, temperature=1.0, seed=9 + i, max_tokens=10, stop_token_ids=()).token_ids
                 for i in range(3)]
    assert [c.token_ids for c in choices] == alone
