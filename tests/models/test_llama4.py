"""Llama 4 (`llama4`) against transformers' Llama4ForCausalLM on the bar of the other families,
on a tiny model whose chunks (8 positions) are shorter than the prompts and whose NoPE layer's
query temperature (scale 1.0) changes every 4 positions; and what only it has: each of chunks, temperature,
L2 qk-norm and input-scaled experts matters, every path (float, packed per-call, the fused decode
step and the decode program, the memories, batching) gives the same."""
from __future__ import annotations

import pytest
import torch

import strata
from strata.models.chunked import ChunkedAttention
from strata.models.expert_act import InputScaled
from strata.models.moe import MoE

from .helpers import REL_TOL, Bare, check_packed_every_memory, load, packed_decode_error, rel_err, tiny_fixture


tiny = tiny_fixture("llama4")


def test_layers_are_as_transformers_builds_them(tiny):
    cfg = tiny.model.config
    hp = strata.gguf.open_model(tiny.gguf("f32")).hparams
    assert (hp.attn_chunk, hp.attn_temperature_length, hp.attn_temperature_scale) == (8, 4, 1.0)
    assert [not n for n in hp.nope_layers] == [bool(r) for r in cfg.no_rope_layers] and hp.qk_l2_norm
    blocks = Bare(tiny.gguf("f32")).model.blocks
    moe = [isinstance(b.ffn, MoE) for b in blocks]
    assert moe == [i in cfg.moe_layers for i in range(4)]
    assert [b.attention.chunk for b in blocks] == [8, 8, 8, 0]
    assert all(isinstance(b.ffn.experts.executor.expert_fn, InputScaled) and b.ffn.experts.executor.expert_fn.input_scaled
               and b.ffn.shared is not None for b, m in zip(blocks, moe) if m)


@pytest.mark.parametrize("change", ["no chunks", "no temperature", "no qk-norm", "scaled outputs"])
def test_each_feature_matters(tiny, change):
    """Without any one of its features the model departs from transformers by ten times the
    tolerance (so the test above checks each)."""
    ids = tiny.prompt_ids(40)
    bare = Bare(tiny.gguf("f32"))
    for b in bare.model.blocks:
        a = b.attention
        if change == "no chunks":
            a.chunk = 0
        elif change == "no temperature":
            a.temperature = None
        elif change == "no qk-norm":
            a.l2_eps = None
        elif isinstance(b.ffn, MoE):  # the router's weights scale the outputs instead
            b.ffn.experts.executor.expert_fn = None
    assert rel_err(bare.forward(ids, 0), tiny.hf_logits(ids)) > 10 * REL_TOL


def test_packed_compute_every_memory_and_the_plan(tiny):
    """Packed compute equals float on the f32 file in every memory; decode runs fused (the decode
    program where the experts stay in place) and picks float's tokens; the default file picks
    float's tokens."""
    from strata import runtime

    def plan(m, memory):
        assert m.plan.decode in (runtime.PROGRAM, runtime.FUSED), (memory, m.plan)
        assert all(step is not None for step in m.runner.steps)
        assert (m.runner.program is not None) == (m.plan.decode == runtime.PROGRAM)

    check_packed_every_memory(tiny, plan)
    ids = tiny.prompt_ids(40)
    with load(tiny.gguf(None)) as ref, load(tiny.gguf(None), "packed") as direct, \
            load(tiny.gguf(None), "packed", "tiered") as tiered:
        a, b = ref.logits(ids), direct.logits(ids)
        assert torch.equal(b, tiered.logits(ids))
        assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.95


def test_packed_decode_steps_equal_the_float_path(tiny):
    """Every decode step of packed compute (per call: chunks, NoPE, temperature in torch; packed
    matrices and the fused expert call) equals the float path within 1e-5, past several chunks."""
    assert packed_decode_error(tiny, 24) < 1e-5


def test_chunked_attention_in_packed_compute_is_the_module_attention(tiny):
    blocks = Bare(tiny.gguf("f32")).model.blocks
    assert all(isinstance(b.attention, ChunkedAttention) for b in blocks)


@pytest.mark.parametrize("compute", ["float", "packed"])
def test_input_scaled_experts_scale_each_assignments_input(tiny, compute):
    """Top-k above 1 (the tiny model uses 2 of its 4 experts here): one routed call computes every
    assignment's expert on x times its router weight and adds the results unweighted: each pick's
    own plain-SwiGLU call on its scaled input, summed."""
    with strata.load(tiny.gguf("q8_0"), compute=compute, threads=1, n_ctx=64, max_batch=1) as m:
        moe = next(b.ffn for b in m.transformer.blocks if isinstance(b.ffn, MoE))
        moe.router.k = 2
        x = torch.randn(5, moe.router.weight.shape[1], generator=torch.Generator().manual_seed(1))
        got = moe(x)
        weights, ids = moe.router(x)
        ones = torch.ones((5, 1), dtype=weights.dtype)
        experts = moe.experts
        experts.executor.expert_fn = None  # plain SwiGLU, weighted outputs
        want = sum(experts(x * weights[:, j:j + 1].to(x.dtype), ones, ids[:, j:j + 1]) for j in range(2))
        assert rel_err(got, want + moe.shared(x)) < 1e-6
        assert rel_err(got, experts(x, weights, ids) + moe.shared(x)) > 1e-3  # the weights at the outputs differ


def test_packed_decode_attends_in_the_native_call(tiny, monkeypatch):
    """Packed compute's decode steps attend in the native decode attention (chunk windows and
    global layers), torch's masked attention only in prefill; the tokens are float's."""
    import strata.models.chunked as chunked
    prompt, seen = tiny.prompt_ids(10, seed=5), []
    with load(tiny.gguf("f32")) as ref:
        want = ref.generate(prompt, temperature=0, max_tokens=20, stop_token_ids=()).token_ids
    real = chunked.attend_chunked
    monkeypatch.setattr(chunked, "attend_chunked", lambda q, *a: seen.append(q.shape[0]) or real(q, *a))
    with load(tiny.gguf("f32"), "packed") as m:
        assert m.generate(prompt, temperature=0, max_tokens=20, stop_token_ids=()).token_ids == want
    assert seen and all(n == len(prompt) for n in seen)  # prefill only: 4 layers x the prompt
