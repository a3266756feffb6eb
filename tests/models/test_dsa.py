"""Sparse latent attention: DeepSeek-V3.2 (`deepseek32`) and GLM-5 (`glm-dsa`) against transformers'
DeepseekV32ForCausalLM and GlmMoeDsaForCausalLM on the bar of the other families, on tiny models
whose lightning indexer keeps 8 positions of the 20-48 their test sequences reach, so the
selection matters; and what only they have: the indexer's choice equal to transformers' (f16 keys
after the Hadamard turn, as llama.cpp caches them), its keys in the latent cache's value slot,
GLM-5's shared layers reusing the choice before them, every path (float, packed per call, the
memories, batching, chunked prefill) giving the same, the fused decode step and program giving the
per-call path's bytes,
`strata inspect`'s verdict."""
from __future__ import annotations

import torch

import pytest

import strata
from strata.cli import main
from strata.models import cache_dims
from strata.models.dsa import DSAttention
from tests.engine.test_fused_decode import _check_fused_equals_per_call, _decode_logits
from tests.fixtures.tiny import GGUF_ARCH, zoo
from tests.fixtures.rewrite import V, rewrite

from .helpers import REL_TOL, Bare, check_packed_every_memory, load, rel_err

KEYS = ("deepseek32", "glmdsa")


@pytest.fixture(params=KEYS, scope="module")
def tiny(request):
    return zoo().get(request.param)


def _hf_choices(tiny, ids: list[int]) -> list[torch.Tensor]:
    """transformers' top-k positions [T, K] of each layer's indexer for one sequence."""
    seen = []
    hooks = [layer.self_attn.indexer.register_forward_hook(lambda m, a, out: seen.append(out[0].long().sort(-1).values))
             for layer in tiny.model.model.layers if layer.self_attn.indexer is not None]
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
    assert all(type(b.attention) is DSAttention for b in bare.model.blocks)
    bare.forward(tiny.prompt_ids(12), 0)
    keys = bare.cache.layer(2)[1][bare.cache.table(0)[0], 0, :12]  # [12, Di] (layer 2 runs its indexer in both)
    assert keys.abs().sum(-1).gt(0).all() and torch.equal(keys, keys.half().float())


def test_packed_compute_every_memory_and_the_plan(tiny):
    """Packed compute equals float on the f32 file in every memory and picks its greedy tokens;
    every block has its fused decode step (the indexer and the sparse attention in native code)."""
    def plan(m, memory):
        assert all(s is not None for s in m.runner.steps), memory
        assert m.plan.decode in ("program", "fused"), (memory, m.plan)

    check_packed_every_memory(tiny, plan)


@pytest.mark.parametrize("outtype", ["q8_0", None], ids=["q8_0", "default"])
def test_fused_step_and_program_equal_the_per_call_path(tiny, outtype):
    """Every block fused (GLM-5's shared layers reading their full layer's choice), the decode
    program over all of them, bit for bit the per-call path (whose decode runs the same native
    indexer and sparse attention), one sequence and three at different positions, past top_k."""
    with strata.load(tiny.gguf(outtype), threads=2, n_ctx=128, max_batch=3, compute="packed",
                     memory="direct") as m:
        assert all(s is not None for s in m.runner.steps)
        assert m.plan.decode == "program" and m.runner.program is not None, m.plan
        _check_fused_equals_per_call(tiny, m)


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_fused_step_equals_the_per_call_path_in_other_cache_types(tiny, kv_type):
    """The same in an f16 and a Q8_0 cache (the latent rows and the indexer's keys both in it)."""
    with strata.load(tiny.gguf("q8_0"), threads=2, n_ctx=128, max_batch=3, compute="packed", memory="direct",
                     kv_type=kv_type) as m:
        assert m.plan.decode == "program"
        _check_fused_equals_per_call(tiny, m)


def test_native_decode_tracks_the_reference(tiny):
    """The decode program (the native indexer's f16 keys, scores and top-k, attention over the
    kept rows) follows the float reference's decode steps on the f32 file, three sequences past
    top_k (where attending to every position departs: test_the_indexer_keeps_what_transformers_keeps)."""
    prompts = [tiny.prompt_ids(5, seed=2), tiny.prompt_ids(19, seed=3), tiny.prompt_ids(11, seed=4)]
    with load(tiny.gguf("f32"), max_batch=3) as ref, load(tiny.gguf("f32"), "packed", max_batch=3) as packed:
        assert packed.plan.decode == "program"
        want, got = _decode_logits(ref, prompts), _decode_logits(packed, prompts)
        for a, b in zip(got, want):
            assert rel_err(a, b) <= REL_TOL


def test_native_calls_refuse_bad_arguments(tiny):
    """The indexer's key cache of the wrong shape, a kept position past the sequence's blocks and a
    batch wider than the layer's buffers are refused with the call named."""
    import torch as t

    from strata import native
    from strata.errors import NativeError
    with strata.load(tiny.gguf("q8_0"), threads=1, n_ctx=64, max_batch=1, compute="packed", memory="direct") as m:
        layer, (k_cache, v_cache) = m.runner.steps[0].layer, m.cache.layer(0)
        with pytest.raises(ValueError, match="indexer's key cache"):
            layer.bind(k_cache, v_cache[..., :-1].contiguous())
        att = m.runner.model.blocks[0].attention
        H, row = att.n_head, att.kv_lora + att.rope_dim
        table = t.zeros((1, 1), dtype=t.int64)
        keep, n_keep = t.full((1, att.top_k), k_cache.shape[2], dtype=t.int64), t.ones(1, dtype=t.int64)
        with pytest.raises(NativeError, match="sparse attention of 1 tokens"):
            native.dsa_attend(att.w.wo.compute.pool, t.zeros((1, H, row)), k_cache, table, keep, n_keep, 1.0,
                              t.empty((1, H, row)))
        layer.bind(k_cache, v_cache)
        x, out = t.zeros((2, layer.n_embd)), native.StepOutputs(layer, 2)
        scratch = t.empty(layer.scratch_bytes(2), dtype=t.uint8)
        layer.whole.keep_rows = 1  # the choice's buffers for one sequence: two are refused
        with pytest.raises(NativeError, match="sparse attention decode step of 2 sequences"):
            layer.run(att.w.wo.compute.pool, t.zeros((2, 1), dtype=t.int64), t.zeros(2, dtype=t.int64),
                      t.zeros((2, att.rope_dim // 2)), t.zeros((2, att.rope_dim // 2)), x, out, scratch)


def test_shared_layers_steps_read_the_full_layers_choice():
    """GLM-5's shared layers' fused steps point at the buffers their full layer's step writes."""
    tiny = zoo().get("glmdsa")
    with strata.load(tiny.gguf("q8_0"), threads=1, n_ctx=64, compute="packed", memory="direct") as m:
        layers = [s.layer for s in m.runner.steps]
        assert [la.index_dim is None for la in layers] == [False, True, False, True]
        assert layers[1].kept is layers[0].kept and layers[3].kept is layers[2].kept
        assert layers[0].kept is not layers[2].kept


def test_default_types_pick_the_float_tokens(tiny):
    """The default file (Q8_0 attention and indexer, F32 indexer weights, Q4_K experts) under packed
    compute picks most of the float path's tokens on the f32 file."""
    ids = tiny.prompt_ids(40)
    with load(tiny.gguf("f32")) as ref, load(tiny.gguf(None), "packed") as packed:
        a, b = ref.logits(ids), packed.logits(ids)
    assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.9


def test_inspect_says_it_runs(tiny, capsys):
    assert main(["inspect", str(tiny.gguf("f32"))]) == 0
    out = capsys.readouterr().out
    assert f"verdict: runs: {GGUF_ARCH[tiny.key]}" in out, out


def test_glm_shared_layers_reuse_the_choice_before_them():
    """GLM-5's layers 1 and 3 (indexer_types "shared") have no indexer and attend to what layers 0
    and 2 keep; GLM-5.2's default pattern (no types key, a context of 1M positions) is layers 0,
    1 and every 4th from 2."""
    tiny = zoo().get("glmdsa")
    bare = Bare(tiny.gguf("f32"))
    assert bare.mf.hparams.indexer.full == (True, False, True, False)
    assert [b.attention.idx is None for b in bare.model.blocks] == [False, True, False, True]
    assert not any(n.startswith(("blk.1.indexer", "blk.3.indexer")) for n in bare.mf.tensors)
    ids = tiny.prompt_ids(30)
    kept, real = [], DSAttention.latent

    def watch(self, x, q_low, batch, cos_sin, cache, keep=None):
        kept.append(keep)
        return real(self, x, q_low, batch, cos_sin, cache, keep)

    DSAttention.latent = watch
    try:
        bare.forward(ids, 0)
    finally:
        DSAttention.latent = real
    assert kept[1] is kept[0] and kept[3] is kept[2] and not torch.equal(kept[0], kept[2])


def test_glm_5_2_default_indexer_pattern(tmp_path):
    tiny = zoo().get("glmdsa")
    path = rewrite(tiny.gguf("f32"), tmp_path / "long.gguf", set={"glm-dsa.context_length": (1 << 20, V.UINT32)},
                   drop={"glm-dsa.attention.indexer.types"})
    from strata.gguf import open_model
    with open_model(path) as mf:
        assert mf.hparams.indexer.full == (True, True, True, False)


def test_a_long_step_scores_in_pieces(tiny, monkeypatch):
    """The indexer scores a long step's queries in pieces that bound the scores' memory: one query
    a piece (the first ones seeing fewer positions than top_k) gives the bytes of one piece."""
    from strata.models import attention, dsa
    ids = tiny.prompt_ids(40)
    whole = Bare(tiny.gguf("f32")).forward(ids, 0)
    rows = attention.query_pieces
    monkeypatch.setattr(dsa, "query_pieces", lambda start, n, heads, budget=None: rows(start, n, heads, heads * (start + n)))
    assert torch.equal(Bare(tiny.gguf("f32")).forward(ids, 0), whole)
