"""Qwen3.5-MoE (`qwen35moe`) against transformers' Qwen3_5MoeForCausalLM on the bar of the other
families (tiny model: three gated DeltaNet layers with 4 value heads over 2 key heads, then gated
full attention with interleaved MRoPE); what differs from qwen3next (value heads tiled over key
heads, beta and alpha apart) is shown to matter; every path (float, packed in every memory,
batching, chunked prefill) gives the same."""
from __future__ import annotations

from strata.models.deltanet import GatedDeltaNet

from .helpers import (REL_TOL, Bare, check_packed_every_memory, rel_err, tiny_fixture)

tiny = tiny_fixture("qwen35moe")


def test_layers_read_tiled_heads_and_apart_beta_alpha(tiny):
    bare = Bare(tiny.gguf("f32"))
    hp = bare.mf.hparams
    assert hp.recurrent_layers == (True, True, True, False) and hp.rope_sections == (2, 1, 1, 0)
    net = bare.model.blocks[0].attention
    assert isinstance(net, GatedDeltaNet) and net.tiled and net.w.wba is None and net.w.wbeta is not None


def test_the_head_order_matters(tiny):
    """Reading the tiled file as grouped (qwen3next's order) departs from transformers."""
    ids = tiny.prompt_ids(12)
    bare = Bare(tiny.gguf("f32"))
    for block in bare.model.blocks[:3]:
        block.attention.tiled = False
    assert rel_err(bare.forward(ids, 0), tiny.hf_logits(ids)) > 10 * REL_TOL


def test_packed_compute_every_memory(tiny):
    check_packed_every_memory(tiny)


def test_memory_figures_count_the_recurrent_state(tiny, capsys):
    """`KVCache.bytes_for` (the load-time budget) and `strata inspect --placement` count each
    recurrent layer's float32 state per slot instead of KV blocks: the figure equals the bytes the
    allocated cache holds."""
    import json

    from strata.cli import main
    from strata.engine.kv_cache import KVCache
    from strata.models import cache_dims, cache_states

    hp = Bare(tiny.gguf("f32")).mf.hparams
    states = cache_states(hp)
    state = (3 * 256 + 4 * 32 * 32) * 4  # per slot and recurrent layer: conv [K-1, C], S [Hv, dk, dv]
    want = KVCache(hp.n_layers, 2, 64, *cache_dims(hp), states=states).nbytes
    got = KVCache.bytes_for(hp.n_layers, 2, 64, *cache_dims(hp), states=states)
    assert got == want and got - KVCache.bytes_for(1, 2, 64, *cache_dims(hp)) == 2 * 3 * state
    assert main(["inspect", str(tiny.gguf("f32")), "--placement", "--ctx", "64", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    figure = next(v for k, v in _walk(shown) if k == "kv_cache_bytes")
    assert figure == KVCache.bytes_for(hp.n_layers, 1, 64, *cache_dims(hp), states=states)


def _walk(d):
    for k, v in (d.items() if isinstance(d, dict) else ()):
        yield k, v
        yield from _walk(v)
