"""Generation through the public API on every architecture: greedy paths equal transformers',
batches equal single runs, streams equal completions, errors are clear."""
from __future__ import annotations

import math

import pytest
import torch

import strata
from strata.engine import compare_logits
from strata.errors import StrataError


def _hf_greedy(tiny, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(tiny.model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_greedy_32_tokens_equal_transformers(tiny, loaded):
    prompt = tiny.prompt_ids(18, seed=3)
    got = loaded(tiny.key).generate(prompt, temperature=0, max_tokens=32, stop_token_ids=())
    assert got.token_ids == _hf_greedy(tiny, prompt, 32) and got.finish_reason == "length"


def test_batch_of_four_prompts_equals_each_alone(tiny, loaded):
    m = loaded(tiny.key)
    prompts = [tiny.prompt_ids(n, seed=n) for n in (5, 23, 11, 16)]
    alone = [m.generate(p, temperature=0, max_tokens=32, stop_token_ids=()).token_ids for p in prompts]
    batch = m.generate_batch(prompts, temperature=0, max_tokens=32, stop_token_ids=())
    assert [c.token_ids for c in batch] == alone


def test_logits_api_equals_transformers(tiny, loaded):
    ids = tiny.prompt_ids(20)
    ref = tiny.hf_logits(ids)
    assert float((loaded(tiny.key).logits(ids) - ref).abs().max() / ref.abs().max()) <= 1e-4


def test_seeded_sampling_repeats_alone_and_in_a_batch(loaded, tiny):
    m = loaded(tiny.key)
    opts = dict(max_tokens=12, temperature=0.9, top_p=0.95, top_k=40, min_p=0.01, seed=123, stop_token_ids=())
    a = m.generate("the expert", **opts).token_ids
    assert m.generate("the expert", **opts).token_ids == a
    assert m.generate_batch(["a model", "the expert"], **opts)[1].token_ids == a


def test_stream_chunks_add_up_to_the_completion(loaded):
    m = loaded("qwen3moe")
    stream = m.generate("numbers 3 33", max_tokens=24, temperature=0.7, seed=2, stream=True, stop_token_ids=())
    chunks = list(stream)
    assert "".join(c.text for c in chunks) == stream.completion.text
    assert [c.token_id for c in chunks] == stream.completion.token_ids
    assert chunks[-1].finish_reason == "length" and all(c.finish_reason is None for c in chunks[:-1])
    assert stream.completion.tokens_per_second > 0


def test_stop_strings_and_tokens(loaded):
    m = loaded("mixtral")
    full = m.generate("the", temperature=0, max_tokens=24, stop_token_ids=())
    stop_at = full.text[len(full.text) // 2:][:3]
    cut = m.generate("the", temperature=0, max_tokens=24, stop=[stop_at], stop_token_ids=())
    assert cut.finish_reason == "stop" and cut.text == full.text[:full.text.index(stop_at)]
    by_token = m.generate("the", temperature=0, max_tokens=24, stop_token_ids=[full.token_ids[5]])
    assert by_token.token_ids == full.token_ids[:full.token_ids.index(full.token_ids[5])]


def test_context_full_ends_with_length(tiny):
    m = strata.load(tiny.gguf("f32"), threads=1, n_ctx=24, max_batch=1)
    out = m.generate(tiny.prompt_ids(20), max_tokens=100, stop_token_ids=())
    assert len(out.token_ids) == 4 and out.finish_reason == "length"


def test_prompt_longer_than_context_is_one_clear_error(tiny):
    m = strata.load(tiny.gguf("f32"), threads=1, n_ctx=16, max_batch=1)
    with pytest.raises(StrataError, match="prompt of 40 tokens does not fit the context of 16 tokens"):
        m.generate(tiny.prompt_ids(40))
    assert m.generate(tiny.prompt_ids(8), temperature=0, max_tokens=2).token_ids  # the engine is still usable


@pytest.mark.parametrize("device, message", [("tpu", "unknown device 'tpu'"), ("cuda:x", "unknown device"),
                                             ("meta", "unknown device 'meta'")])
def test_unknown_device_is_refused(tiny, device, message):
    with pytest.raises(StrataError, match=message):
        strata.load(tiny.gguf("f32"), device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_gpu_is_refused(tiny):
    with pytest.raises(StrataError, match="no CUDA GPU"):
        strata.load(tiny.gguf("f32"), device="cuda")


def test_perplexity_matches_transformers_logits(loaded):
    from tests.fixtures.tiny import zoo

    tiny = zoo().get("olmoe")
    ids = tiny.prompt_ids(96)
    result = loaded("olmoe").perplexity(ids, n_ctx=32, keep_logits=True)
    nll = []
    for c in range(3):
        chunk = ids[c * 32:(c + 1) * 32]
        logp = tiny.hf_logits(chunk)[16:31].double().log_softmax(-1)
        nll += [-float(logp[j, chunk[16 + j + 1]]) for j in range(15)]
    assert result.n_scored == 45 and result.ppl == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-4)
    same = compare_logits(result.logits, result.logits)
    assert same.kl_mean == pytest.approx(0, abs=1e-12) and same.top1_agreement == 1.0


def test_more_prompts_than_slots_queue_and_a_closed_stream_frees_its_slot(tiny):
    m = strata.load(tiny.gguf("f32"), threads=1, n_ctx=64, max_batch=2)
    prompts = [tiny.prompt_ids(n, seed=n) for n in (3, 9, 6, 12, 4)]
    greedy = dict(temperature=0, max_tokens=8, stop_token_ids=())
    batch = m.generate_batch(prompts, **greedy)
    assert [c.token_ids for c in batch] == [m.generate(p, **greedy).token_ids for p in prompts]
    stream = m.generate(prompts[0], max_tokens=50, stream=True)
    next(iter(stream))
    stream.close()
    assert m.cache.n_free == 2 and not m.engine.busy


def test_time_split_restarts_at_reset(tiny):
    """`reset_time_split` restarts every part, the memory's waits included (its counters are
    never reset): right after it nothing is counted, and the expert waits of later tokens are at
    most their experts' time."""
    with strata.load(tiny.gguf(None), threads=1, n_ctx=128, compute="packed", memory="tiered") as m:
        m.generate(tiny.prompt_ids(6, seed=1), max_tokens=8, stop_token_ids=())
        assert m.time_split()["expert_wait"] > 0
        m.reset_time_split()
        assert m.time_split() == {"tokens": 0, "total_s": 0.0, "attention": 0.0, "expert_compute": 0.0,
                                  "expert_wait": 0.0, "dequantization": 0.0, "other": 0.0}
        m.generate(tiny.prompt_ids(6, seed=2), max_tokens=8, stop_token_ids=())
        s, t = m.time_split(), m.transformer.times()
        assert 0 < s["expert_wait"] * s["tokens"] <= t.experts_s
