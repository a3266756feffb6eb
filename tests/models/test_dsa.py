"""DeepSeek-V3.2 (`deepseek32`) against transformers' DeepseekV32ForCausalLM on the bar of the other
families, on a tiny model whose lightning indexer keeps 8 positions of the 20-48 its test
sequences reach, so the selection matters; and what only it has: the indexer's choice equal to
transformers' (f16 keys after the Hadamard turn, as llama.cpp caches them), its keys in the
latent cache's value slot, every path (float, packed per call, the memories, batching, chunked
prefill) giving the same, the plan saying why decode runs per call, `strata inspect`'s verdict."""
from __future__ import annotations

import torch

from strata.cli import main
from strata.models import cache_dims
from strata.models.dsa import DSAttention

from .helpers import (REL_TOL, Bare, check_batch_of_two, check_chunked_prefill, check_generate_batch, check_greedy_32,
                      check_packed_every_memory, check_prefill_and_decode, load, rel_err, tiny_fixture)

tiny = tiny_fixture("deepseek32")


def test_prefill_and_each_decode_step_match_transformers(tiny, record_property):
    check_prefill_and_decode(tiny, record_property, "deepseek32", 20, 16)


def test_greedy_32_tokens_match_transformers(tiny):
    check_greedy_32(tiny)


def _hf_choices(tiny, ids: list[int]) -> list[torch.Tensor]:
    """transformers' top-k positions [T, K] of each layer's indexer for one sequence."""
    seen = []
    hooks = [layer.self_attn.indexer.register_forward_hook(lambda m, a, out: seen.append(out[0].long().sort(-1).values))
             for layer in tiny.model.model.layers]
    try:
        tiny.hf_logits(ids)
    finally:
        for h in hooks:
            h.remove()
    return seen


def test_the_indexer_keeps_what_transformers_keeps(tiny):
    """Each layer's choice for every token past the 8th equals transformers' top-k, and the
    selection matters: attending to every position departs from transformers."""
    ids = tiny.prompt_ids(40)
    kept = []
    real = DSAttention.select

    def watch(self, *a):
        out = real(self, *a)
        kept.append(out.sort(-1).values)
        return out

    DSAttention.select = watch
    try:
        bare = Bare(tiny.gguf("f32"))
        assert rel_err(bare.forward(ids, 0), tiny.hf_logits(ids)) <= REL_TOL
    finally:
        DSAttention.select = real
    K = tiny.model.config.index_topk
    for mine, theirs in zip(kept, _hf_choices(tiny, ids), strict=True):
        assert torch.equal(mine[K:], theirs[K:])
    dense = Bare(tiny.gguf("f32"))
    for block in dense.model.blocks:
        block.attention.top_k = 10 ** 6
    assert rel_err(dense.forward(ids, 0), tiny.hf_logits(ids)) > 10 * REL_TOL


def test_indexer_keys_sit_in_the_value_slot_in_f16(tiny):
    """Per layer and position the cache holds the latent row (kv_lora + rope) and the indexer key
    (index_head_dim), the key's values f16 numbers, as llama.cpp's indexer cache holds them."""
    cfg = tiny.model.config
    bare = Bare(tiny.gguf("f32"))
    assert cache_dims(bare.mf.hparams) == (1, cfg.kv_lora_rank + cfg.qk_rope_head_dim, cfg.index_head_dim)
    assert all(type(b.attention) is DSAttention and b.attention.idx is not None for b in bare.model.blocks)
    bare.forward(tiny.prompt_ids(12), 0)
    keys = bare.cache.layer(1)[1][bare.cache.table(0)[0], 0, :12]  # [12, Di]
    assert keys.abs().min(-1).values.gt(0).all() and torch.equal(keys, keys.half().float())


def test_a_batch_of_two_equals_each_alone(tiny):
    check_batch_of_two(tiny)


def test_chunked_prefill_selects_over_the_cached_keys(tiny):
    """A prompt in chunks of 5, 1 and 7 tokens gives transformers' logits: the later chunks'
    choices score the keys the earlier ones cached."""
    check_chunked_prefill(tiny)


def test_packed_compute_every_memory_and_the_plan(tiny):
    """Packed compute equals float on the f32 file in every memory and picks its greedy tokens;
    decode runs per call (the native step has no indexer) and the plan says so."""
    def plan(m, memory):
        assert m.plan.decode == "packed per-call" and not any(m.runner.steps or ()), memory
        assert "sparse attention: the native step has no indexer" in m.plan.decode_why, m.plan.decode_why

    check_packed_every_memory(tiny, plan)


def test_default_types_pick_the_float_tokens(tiny):
    """The default file (Q8_0 attention and indexer, F32 indexer weights, Q4_K experts) under packed
    compute picks most of the float path's tokens on the f32 file."""
    ids = tiny.prompt_ids(40)
    with load(tiny.gguf("f32")) as ref, load(tiny.gguf(None), "packed") as packed:
        a, b = ref.logits(ids), packed.logits(ids)
    assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.9


def test_generate_batch_equals_each_alone(tiny):
    check_generate_batch(tiny)


def test_inspect_says_it_runs(tiny, capsys):
    assert main(["inspect", str(tiny.gguf("f32"))]) == 0
    out = capsys.readouterr().out
    assert "verdict: runs: deepseek32" in out, out
