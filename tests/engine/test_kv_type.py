"""`load(kv_type=...)` / `--kv-type`: the KV cache in f16, bf16 or Q8_0 blocks. Greedy decoding
over it follows the f32 cache's tokens and its logits stay close (measured on these fixtures:
q8_0 within 5e-3 of a logit range of ~20, f16 within 2e-4, bf16 within 1.5e-3), on the decode
program (packed compute), on float compute and on DeepSeek's latent cache; the cache takes the
bytes the type says; bad values are refused with one line naming the option."""
from __future__ import annotations

import pytest
import torch

import strata
from strata.errors import StrataArgumentError, StrataError
from tests.fixtures.tiny import zoo

STEPS = 16
#: max |logit difference| from the f32 cache allowed per type (logit ranges here are ~20)
TOLERANCE = {"q8_0": 2e-2, "f16": 1e-3, "bf16": 5e-3}


def _greedy(model, ids: list[int]) -> tuple[list[int], torch.Tensor]:
    """Prefill `ids`, then STEPS greedy decode steps: (tokens, logits [1 + STEPS, V])."""
    slot = model.cache.allocate()
    try:
        batch = model.cache.batch([slot], [0], [len(ids)])
        logits = [model.runner(torch.tensor(ids), batch, model.cache)[-1:].clone()]
        tokens, pos = [], len(ids)
        for _ in range(STEPS):
            tokens.append(int(logits[-1][-1].argmax()))
            batch = model.cache.batch([slot], [pos], [1])
            logits.append(model.runner(torch.tensor(tokens[-1:]), batch, model.cache).clone())
            pos += 1
        return tokens, torch.cat(logits)
    finally:
        model.cache.free(slot)


def _run(tiny, kv_type, compute="packed"):
    with strata.load(tiny.gguf("f32"), threads=1, n_ctx=128, kv_type=kv_type, compute=compute) as m:
        return _greedy(m, tiny.prompt_ids(12, seed=1)), m.cache


@pytest.mark.parametrize("kv_type", ["q8_0", "f16", "bf16"])
def test_decoding_over_a_typed_cache_follows_f32(tiny, kv_type):
    (want_tokens, want), _ = _run(tiny, None)
    (tokens, got), cache = _run(tiny, kv_type)
    assert cache.kv_type == kv_type and cache.k[0].dtype == {"q8_0": torch.uint8, "f16": torch.float16,
                                                             "bf16": torch.bfloat16}[kv_type]
    assert sum(a == b for a, b in zip(tokens, want_tokens)) >= STEPS - 2
    assert 0 < (got - want).abs().max().item() < TOLERANCE[kv_type]


def test_q8_0_cache_on_float_compute_and_bytes(tiny):
    """Float compute writes the blocks with torch and reads them dequantized: the same tokens as
    f32, logits close; the cache is 34 bytes per 32 values, 17/64 of f32's."""
    (want_tokens, want), f32_cache = _run(tiny, None, "float")
    (tokens, got), cache = _run(tiny, "q8_0", "float")
    assert sum(a == b for a, b in zip(tokens, want_tokens)) >= STEPS - 2
    assert (got - want).abs().max().item() < TOLERANCE["q8_0"]
    assert cache.bytes_per_token * 64 == f32_cache.bytes_per_token * 17
    assert cache.nbytes * 64 == f32_cache.nbytes * 17


@pytest.mark.parametrize("kv_type", ["q8_0", "bf16"])
def test_deepseek_latent_cache_takes_the_type(kv_type):
    """DeepSeek's one latent row [c | k_rope] per position is stored in the type (Q8_0 blocks of
    the latent and the rope key; 32 divides both widths in real models)."""
    tiny = zoo().get("deepseek2")
    (want_tokens, want), _ = _run(tiny, None)
    (tokens, got), cache = _run(tiny, kv_type)
    assert cache.kv_type == kv_type
    assert sum(a == b for a, b in zip(tokens, want_tokens)) >= STEPS - 2
    assert (got - want).abs().max().item() < TOLERANCE[kv_type]


def test_bad_kv_types_are_refused(tiny):
    with pytest.raises(StrataArgumentError, match="kv_type: expected one of f32, f16, bf16, q8_0"):
        strata.load(tiny.gguf("f32"), kv_type="q4_0")
    from strata.engine.kv_cache import KVCache
    with pytest.raises(StrataError, match="--kv-type q8_0: a cache row of 48 values"):
        KVCache(1, 1, 16, 2, 48, kv_type="q8_0")


def test_cli_options_reach_load_and_stats(tiny):
    """--kv-type is one of the shared model options (generate, chat, serve, bench, perplexity), goes
    to load() and is reported by --stats."""
    import argparse

    from strata.commands.common import add_model_args, format_kv_cache, load_kwargs
    p = argparse.ArgumentParser()
    add_model_args(p)
    args = p.parse_args([str(tiny.gguf("f32")), "--kv-type", "q8_0", "--ctx", "64"])
    assert load_kwargs(args)["kv_type"] == "q8_0"
    assert "kv_type" not in load_kwargs(p.parse_args([str(tiny.gguf("f32"))]))
    with strata.load(**{**load_kwargs(args), "path": args.model}) as m:
        line = format_kv_cache(m.cache)
    hd_rows = m.cache.k[0].shape[1] * m.cache.k[0].shape[3] * 2 * len(m.cache.k)
    assert line.startswith(f"kv cache: q8_0, {hd_rows} bytes per token")
