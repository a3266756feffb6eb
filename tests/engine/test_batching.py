"""Continuous batching on real (tiny) models: chunked prefill beside running decodes, many
sequences of different lengths sharing the paged KV cache, a pool small enough to preempt,
cancellation, the bounded queue, and one acquisition per routed expert per step.
"""
from __future__ import annotations

import random

import pytest
import torch

import strata
from strata.engine import EngineFull, Sequence
from strata.engine.sampling import SamplingParams
from strata.engine.sequence import StopConditions
from tests.fixtures.tiny import zoo


def _ids(vocab: int, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def _seq(i: int, ids: list[int], max_tokens: int) -> Sequence:
    return Sequence(i, ids, SamplingParams(), StopConditions(max_tokens=max_tokens, stop_token_ids=frozenset()))


def test_a_long_prompt_beside_four_decoding_streams_does_not_stall_them():
    """The bound: between two tokens of a running stream lies one engine step, carrying at most
    decoding_step_tokens - 4 = 508 tokens of the new prompt's prefill (not its 1500)."""
    tiny = zoo().get("qwen3moe")
    with strata.load(tiny.gguf("f32"), threads=1, n_ctx=2048, max_batch=5, memory="direct",
                     decoding_step_tokens=512) as m:
        V, engine = m.tokenizer.vocab_size, m.engine
        streams = [_seq(i, _ids(V, 6 + i, seed=i), max_tokens=30) for i in range(4)]
        for s in streams:
            engine.add(s)
        for _ in range(3):
            engine.step()
        long = _seq(9, _ids(V, 1500, seed=9), max_tokens=2)
        engine.add(long)
        last = {s.seq_id: 0 for s in streams}
        gaps, prefill_per_step, step = [], [], 0
        while not long.output_ids:
            step += 1
            before = long.n_cached
            produced = engine.step()
            prefill_per_step.append(long.n_cached - before)
            for seq, _ in produced:
                if seq.seq_id in last:
                    gaps.append(step - last[seq.seq_id])
                    last[seq.seq_id] = step
        assert prefill_per_step == [508, 508, 484]
        assert len(gaps) == 4 * step and max(gaps) == 1
        assert all(len(s.output_ids) == 3 + step for s in streams)
        engine.abort()
        assert m.cache.n_free_blocks == m.cache.n_blocks


@pytest.mark.parametrize("key", ["mixtral", "qwen3moe", "deepseek3", "gptoss", "glm4moe", "minimax", "mimo2", "hyv3",
                                 "deepseek32", "glmdsa"])
def test_sixteen_sequences_of_different_lengths_give_their_outputs_alone(key):
    """Paged and chunked: 16 prompts from 1 to 700 tokens run together (several steps of 512
    tokens mixing prefill chunks and decodes) give each prompt's greedy output alone."""
    tiny = zoo().get(key)
    lengths = [1, 700, 5, 33, 16, 17, 250, 3, 64, 120, 9, 400, 48, 2, 90, 31]
    with strata.load(tiny.gguf("f32"), threads=1, n_ctx=1024, max_batch=16, memory="direct") as m:
        prompts = [_ids(m.tokenizer.vocab_size, n, seed=n) for n in lengths]
        together = m.generate_batch(prompts, temperature=0, max_tokens=5, stop_token_ids=())
        alone = [m.generate(p, temperature=0, max_tokens=5, stop_token_ids=()) for p in prompts]
        assert [c.token_ids for c in together] == [c.token_ids for c in alone]
        assert m.cache.n_free_blocks == m.cache.n_blocks and m.engine.scheduler.n_preempted == 0


def test_a_pool_too_small_for_every_sequence_preempts_and_outputs_stay_the_same():
    tiny = zoo().get("olmoe")
    lengths = [60, 50, 40, 30]
    with strata.load(tiny.gguf("f32"), threads=1, n_ctx=96, max_batch=4, kv_blocks=8, max_step_tokens=64,
                     memory="direct") as m:
        assert m.cache.n_blocks == 8  # 128 positions for four sequences that grow to 90, 80, 70 and 60
        prompts = [_ids(m.tokenizer.vocab_size, n, seed=n) for n in lengths]
        together = m.generate_batch(prompts, temperature=0, max_tokens=30, stop_token_ids=())
        assert m.engine.scheduler.n_preempted > 0
        alone = [m.generate(p, temperature=0, max_tokens=30, stop_token_ids=()) for p in prompts]
        assert [c.token_ids for c in together] == [c.token_ids for c in alone]
        assert m.cache.n_free_blocks == 8


def test_closed_streams_free_their_blocks_within_a_step_and_nothing_leaks():
    tiny = zoo().get("mixtral")
    rng = random.Random(5)
    with strata.load(tiny.gguf("f32"), threads=1, n_ctx=256, max_batch=4, memory="direct") as m:
        V, cache = m.tokenizer.vocab_size, m.cache
        streams = [m.generate(_ids(V, 20 + 5 * i, seed=i), max_tokens=40, stream=True, stop_token_ids=())
                   for i in range(3)]
        for s in streams:
            next(s)
        seq = m.engine.running[0]  # the first stream's
        held, free = len(cache.table(seq.slot)), cache.n_free_blocks
        assert held == 2  # 20 prompt tokens and a few generated: two blocks of 16
        streams[0].close()  # no step in between: the blocks are back at once
        assert cache.n_free_blocks == free + held and len(m.engine.running) == 2
        for s in streams[1:]:
            s.close()
        live = []
        for i in range(200):  # clients come and go at random
            live.append(iter(m.generate(_ids(V, rng.randint(1, 60), seed=100 + i), max_tokens=rng.randint(1, 12),
                                        stream=True, stop_token_ids=())))
            for s in list(live):
                if rng.random() < 0.3:
                    s.close()
                    live.remove(s)
                elif next(s, None) is None:
                    live.remove(s)
        for s in live:
            s.close()
        assert not m.engine.busy and cache.n_free_blocks == cache.n_blocks and cache.n_free == cache.n_slots


def test_engine_full_when_the_queue_is_full(tiny):
    with strata.load(tiny.gguf("f32"), threads=1, n_ctx=64, max_batch=2, max_waiting=2, memory="direct") as m:
        V = m.tokenizer.vocab_size
        seqs = [_seq(i, _ids(V, 4, seed=i), max_tokens=3) for i in range(4)]
        m.engine.add(seqs[0])
        m.engine.add(seqs[1])
        with pytest.raises(EngineFull, match="max_waiting=2"):
            m.engine.add(seqs[2])
        m.engine.step()  # both admitted: the queue has room again
        m.engine.add(seqs[2])
        m.engine.add(seqs[3])
        with pytest.raises(EngineFull):
            m.generate([1, 2, 3], max_tokens=2)
        assert m.engine.busy and len(m.engine.waiting) == 2  # the refused request left nothing behind
        m.engine.abort()
        with pytest.raises(EngineFull):  # a batch larger than the queue is refused whole
            m.generate_batch([[1, 2]] * 5, max_tokens=2)
        assert not m.engine.busy and m.cache.n_free_blocks == m.cache.n_blocks


@pytest.mark.parametrize("compute", ["float", "packed"])
def test_each_routed_expert_is_acquired_once_per_step_for_the_whole_batch(compute):
    """Eight sequences, 4 experts, top-2: 16 assignments per layer and step overlap; each step
    acquires every routed expert once (float: exactly the distinct experts the router chose)."""
    tiny = zoo().get("qwen3moe")
    with strata.load(tiny.gguf("f32"), threads=1, n_ctx=128, max_batch=8, memory="direct", compute=compute) as m:
        calls: list[tuple[int, list[int]]] = []
        mem = m.memory
        for name in ("start",):
            original = getattr(mem, name)

            def counting(layer, expert_ids, _original=original):
                calls.append((layer, [int(e) for e in expert_ids]))
                return _original(layer, expert_ids)
            setattr(mem, name, counting)

        def served(layer, expert_ids, n_used, _original=mem.served_fixed):
            # the decode program computes from experts in place: one grouped call per layer,
            # each distinct routed expert once (it reports the routing instead of acquiring)
            assert len(set(expert_ids.flatten().tolist())) == n_used
            calls.append((layer, sorted(set(expert_ids.flatten().tolist()))))
            return _original(layer, expert_ids, n_used)
        mem.served_fixed = served
        routed: dict[int, set[int]] = {}
        for i, block in enumerate(m.transformer.blocks):
            block.ffn.router.register_forward_hook(
                lambda mod, args, out, i=i: routed.setdefault(i, set()).update(out[1].flatten().tolist()))
        V = m.tokenizer.vocab_size
        for i in range(8):
            m.engine.add(_seq(i, _ids(V, 3 + 2 * i, seed=i), max_tokens=4))
        n_steps = 0
        while m.engine.busy:
            calls.clear()
            routed.clear()
            m.engine.step()
            n_steps += 1
            per_layer: dict[int, list[int]] = {}
            for layer, ids in calls:
                per_layer.setdefault(layer, []).extend(ids)
            assert sorted(per_layer) == list(range(len(m.transformer.blocks)))
            for layer, ids in per_layer.items():
                assert len(ids) == len(set(ids)) <= 4  # once each, for up to 16 assignments
                if compute == "float":
                    assert set(ids) == routed[layer]
        assert n_steps == 4  # one prefill step of all eight, three decode steps of all eight


def test_a_prompt_chunk_after_cached_positions_equals_the_whole_prompt():
    """The model's Batch takes (cached, new) per sequence: a prompt run as chunks of 7 gives the
    logits of the whole prompt at once, on every architecture's cache form (MLA latent, sinks)."""
    for key in ("qwen2moe", "deepseek3", "gptoss", "glm4moe"):
        tiny = zoo().get(key)
        with strata.load(tiny.gguf("f32"), threads=1, n_ctx=64, max_batch=2, memory="direct") as m:
            ids = tiny.prompt_ids(30)
            whole = m.logits(ids)
            cache, slot = m.cache, m.cache.allocate()
            try:
                parts = []
                for start in range(0, len(ids), 7):
                    chunk = ids[start:start + 7]
                    batch = cache.batch([slot], [start], [len(chunk)])
                    parts.append(m.transformer(torch.tensor(chunk), batch, cache, all_logits=True))
            finally:
                cache.free(slot)
            chunked = torch.cat(parts)
            assert (chunked - whole).abs().max() <= 1e-4 * whole.abs().max(), key

