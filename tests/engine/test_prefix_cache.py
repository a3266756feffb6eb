"""The prefix cache: KV blocks shared across sequences by chained content hash, refcounted,
evicted LRU; first the bookkeeping alone (BlockTables, the scheduler over a fake model that
refuses to write a shared or registered block), then a real tiny model whose outputs and logits
with a cached prefix equal those of a cache that is off.
"""
from __future__ import annotations

import random

import pytest
import torch

import strata
from strata.engine import BlockTables, Scheduler, Sequence
from strata.engine.kv_cache import KVCache, block_hash, block_hashes
from strata.models import cache_dims
from strata.engine.sampling import SamplingParams
from strata.engine.sequence import StopConditions
from tests.fixtures.tiny import zoo

P = 16


def _hashes(ids: list[int]) -> list[bytes]:
    return block_hashes(ids, len(ids) // P, [], P)


def _filled(bt: BlockTables, ids: list[int]) -> int:
    """A slot holding `ids` (whole blocks), its blocks registered as a finished prefill leaves them."""
    slot = bt.allocate()
    assert bt.reserve(slot, len(ids))
    bt.commit(slot, _hashes(ids), ids)
    return slot


# ---- bookkeeping ----

def test_a_block_hash_chains_its_prefix():
    a, b = list(range(16)), list(range(100, 116))
    assert block_hash(b"", a) == block_hash(b"", list(a)) != block_hash(b"", a[::-1])
    # the same 16 tokens after a different first block are a different block
    assert _hashes(a + b)[1] != _hashes(b + b)[1] and _hashes(a + b)[0] == _hashes(a + a)[0]
    bt = BlockTables(n_slots=3, n_ctx=64, block_size=P)
    _filled(bt, a + b)
    other = bt.allocate()
    assert bt.match(other, _hashes(b + b)) == 0 and bt.table(other) == []  # b at position 16 only
    assert bt.match(other, _hashes(a + b[:8] + a[:8])) == 1  # the first block only


def test_shared_blocks_are_refcounted_and_stay_cached_when_released():
    bt = BlockTables(n_slots=3, n_ctx=64, n_blocks=6, block_size=P)
    ids = list(range(48))
    first = _filled(bt, ids)
    second = bt.allocate()
    assert bt.match(second, _hashes(ids)) == 3 and bt.table(second) == bt.table(first)
    assert bt.n_used_blocks == 3 and bt.n_cached_blocks == 3
    bt.free(first)  # the second still holds them
    assert bt.n_used_blocks == 3 and bt.n_free_blocks == 3
    bt.free(second)  # no table holds them: cached and evictable, counted free
    assert bt.n_used_blocks == 0 and bt.n_free_blocks == 6 and bt.n_cached_blocks == 3
    third = bt.allocate()
    assert bt.match(third, _hashes(ids)) == 3 and bt.n_free_blocks == 3
    with pytest.raises(ValueError, match="already holds 3 blocks"):
        bt.match(third, _hashes(ids))


def test_eviction_takes_free_blocks_first_then_the_least_recently_released():
    bt = BlockTables(n_slots=4, n_ctx=64, n_blocks=6, block_size=P)
    old, new = list(range(32)), list(range(500, 532))
    bt.free(_filled(bt, old))  # released first: evicted first, its second block before its first
    bt.free(_filled(bt, new))
    assert bt.n_free_blocks == 6 and bt.n_cached_blocks == 4
    s = bt.allocate()
    assert bt.reserve(s, 32) and bt.n_cached_blocks == 4  # the two never-cached free blocks
    t = bt.allocate()
    assert bt.reserve(t, 16) and bt.n_cached_blocks == 3  # evicts old's tail
    probe = bt.allocate()
    assert bt.match(probe, _hashes(old)) == 1 and bt.match(bt.allocate(), _hashes(new)) == 2
    bt.free(probe)
    assert bt.reserve(t, 32) and bt.n_cached_blocks == 2  # old's head, released again, goes next
    assert bt.n_free_blocks == 0 and not bt.reserve(s, 48)  # blocks tables hold are never evicted


def test_a_disabled_cache_registers_and_matches_nothing():
    bt = BlockTables(n_slots=2, n_ctx=64, block_size=P, prefix_cache=False)
    ids = list(range(32))
    bt.free(_filled(bt, ids))
    assert bt.n_cached_blocks == 0 and bt.match(bt.allocate(), _hashes(ids)) == 0


POOLS: dict[int, dict] = {}  # id(BlockTables) -> what the fake model wrote: (block, offset) -> token id


class StrictFakeModel:
    """The scheduler test's fake model, run as the engine runs a step (registering filled blocks
    after it), that fails on a write into a block another table holds or the cache has registered."""

    def __init__(self, sched: Scheduler, vocab: int = 97):
        self.sched, self.blocks, self.vocab = sched, sched.blocks, vocab
        self.pool = POOLS.setdefault(id(sched.blocks), {})
        self.blocks.copy_block = self.copy_block

    def copy_block(self, src: int, dst: int, n: int) -> None:
        for p in range(n):
            self.pool[dst, p] = self.pool[src, p]

    def step(self, work):
        for seq, n in work:
            table = self.blocks.table(seq.slot)
            for p in range(seq.n_cached, seq.n_cached + n):
                block = table[p // P]
                assert self.blocks._refs[block] == 1 and block not in self.blocks._entry, "a shared or cached block written"
                self.pool[block, p % P] = seq.all_ids[p]
            seq.n_cached += n
            self.sched.computed(seq)
        for seq, n in work:
            if seq.n_cached == len(seq.all_ids):
                history = [self.pool[table[p // P], p % P] for table in [self.blocks.table(seq.slot)]
                           for p in range(seq.n_cached)]
                seq.append(sum((i + 1) * t for i, t in enumerate(history)) * 7919 % self.vocab)
                if seq.finished:
                    self.sched.retire(seq)


def _seq(i: int, ids: list[int], max_tokens: int = 6) -> Sequence:
    return Sequence(i, ids, SamplingParams(), StopConditions(max_tokens=max_tokens, stop_token_ids=frozenset()))


def _run(sched: Scheduler, seqs: list[Sequence]) -> list[list[int]]:
    model = StrictFakeModel(sched)
    for s in seqs:
        sched.add(s)
    while sched.busy:
        model.step(sched.schedule())
    return [s.output_ids for s in seqs]


def test_concurrent_sequences_share_a_system_prompt_and_give_their_outputs_alone():
    rng = random.Random(1)
    system = [rng.randrange(97) for _ in range(100)]
    prompts = [system + [rng.randrange(97) for _ in range(rng.randint(1, 40))] for _ in range(8)]
    bt = BlockTables(n_slots=8, n_ctx=256, block_size=P)
    sched = Scheduler(bt, max_step_tokens=64)
    first = _run(sched, [_seq(0, prompts[0])])  # computes and registers the system prompt's 6 full blocks
    seqs = [_seq(i, p) for i, p in enumerate(prompts)]
    together = _run(sched, seqs)  # admitted over several steps, all sharing those blocks
    # the system prompt's 6 whole blocks shared and its last 4 tokens copied from the first run's
    # tail; the first prompt again: all but its last token
    assert seqs[0].n_prompt_cached == len(prompts[0]) - 1 and min(s.n_prompt_cached for s in seqs) >= 100
    alone = [_run(Scheduler(BlockTables(1, 256, block_size=P, prefix_cache=False)), [_seq(i, p)])[0]
             for i, p in enumerate(prompts)]
    assert together == alone and first[0] == alone[0]
    assert bt.n_used_blocks == 0 and bt.n_free == 8


def test_a_whole_cached_prompt_still_computes_its_last_token():
    bt = BlockTables(n_slots=2, n_ctx=128, block_size=P)
    sched = Scheduler(bt)
    ids = list(range(1, 49))  # three whole blocks
    _run(sched, [_seq(0, ids, max_tokens=1)])
    again = _seq(1, ids, max_tokens=1)
    sched.add(again)
    work = sched.schedule()
    # two blocks shared, 15 positions of the third copied (it is registered: the new sequence writes its own)
    assert [(s.seq_id, n) for s, n in work] == [(1, 1)] and again.n_cached == 47
    assert bt.table(again.slot)[:2] == [bt._cached[h] for h in again.block_hashes[:2]]
    assert bt.table(again.slot)[2] not in bt._entry


def test_cancelled_sequences_release_their_references():
    bt = BlockTables(n_slots=4, n_ctx=256, n_blocks=24, block_size=P)
    sched = Scheduler(bt, max_step_tokens=32)
    shared = list(range(64))
    _run(sched, [_seq(0, shared + [1])])
    seqs = [_seq(i, shared + [i] * 30, max_tokens=50) for i in range(1, 4)]
    model = StrictFakeModel(sched)
    for s in seqs:
        sched.add(s)
    for _ in range(3):
        model.step(sched.schedule())
    assert bt.n_used_blocks > 4 and bt._refs[bt.table(seqs[0].slot)[0]] == 3
    sched.cancel(seqs[0])  # running
    assert bt._refs[bt.table(seqs[1].slot)[0]] == 2
    sched.abort()
    assert bt.n_used_blocks == 0 and bt.n_free_blocks == 24 and bt.n_cached_blocks >= 4


def test_no_block_leaks_under_random_sharing_preemption_and_cancellation():
    rng = random.Random(7)
    bt = BlockTables(n_slots=6, n_ctx=160, n_blocks=20, block_size=P)
    sched = Scheduler(bt, max_step_tokens=48)
    model = StrictFakeModel(sched)
    stems = [[rng.randrange(97) for _ in range(48)] for _ in range(3)]
    live = []
    for step in range(400):
        if rng.random() < 0.3 and len(sched.waiting) < 4:
            ids = rng.choice(stems)[:rng.randint(1, 48)] + [rng.randrange(97) for _ in range(rng.randint(1, 40))]
            live.append(_seq(step, ids, max_tokens=rng.randint(1, 40)))
            sched.add(live[-1])
        if rng.random() < 0.05 and live:
            sched.cancel(rng.choice(live))
        if sched.busy:
            model.step(sched.schedule())
        held = [b for s in sched.running for b in bt.table(s.slot)]
        assert sum(bt._refs) == len(held) and bt.n_used_blocks == len(set(held))
        assert len(set(held)) + bt.n_free_blocks == bt.n_blocks
    sched.abort()
    assert bt.n_used_blocks == 0 and bt.n_free_blocks == 20 and sched.n_preempted > 0 and bt.n_hit > 0


def _finish(sched: Scheduler, work) -> None:
    model = StrictFakeModel(sched)
    model.step(work)
    while sched.busy:
        model.step(sched.schedule())


def test_a_prompt_that_goes_on_mid_block_copies_the_positions_it_shares():
    """Token-granular reuse, as llama-server's prompt cache has: the positions a cached block
    (a whole one, or the tail a finished sequence left) starts with are copied, not recomputed,
    and the outputs are those of a cache that is off."""
    bt = BlockTables(n_slots=2, n_ctx=128, block_size=P)
    sched = Scheduler(bt)
    a = list(range(1, 49))
    (out,) = _run(sched, [_seq(0, a, max_tokens=3)])  # 48 + 2 outputs computed: 3 whole blocks, a tail of 2
    b = _seq(1, a[:40] + [90, 91, 92])  # goes another way 8 tokens into the third block
    c = _seq(2, a + out[:2] + [77])  # goes on after the tail
    for seq, cached in ((b, 40), (c, 50)):
        sched.add(seq)
        work = sched.schedule()
        assert seq.n_cached == cached and [(s.seq_id, n) for s, n in work] == [(seq.seq_id, len(seq.all_ids) - cached)]
        _finish(sched, work)
        alone = _run(Scheduler(BlockTables(1, 128, block_size=P, prefix_cache=False)), [_seq(seq.seq_id, seq.prompt_ids)])
        assert seq.output_ids == alone[0]
    assert bt.n_used_blocks == 0


def test_a_kept_tail_is_evicted_before_its_prefix_and_not_copied_without_a_free_block():
    bt = BlockTables(n_slots=3, n_ctx=64, n_blocks=4, block_size=P)
    ids = list(range(1, 41))  # 2 whole blocks and a tail of 8 + 1 output computed
    _run(Scheduler(bt), [_seq(0, ids, max_tokens=2)])
    assert bt.n_cached_blocks == 2 and len(bt._entry) == 3 and bt.n_free_blocks == 4
    hold = bt.allocate()
    assert bt.reserve(hold, 16)  # the free block
    probe, hashes = bt.allocate(), _hashes(ids[:32])
    assert bt.match(probe, hashes) == 2
    assert bt.match_partial(probe, hashes[1], ids[32:39]) == 0  # the only block to take is the tail itself
    assert len(bt._entry) == 3 and len(bt.table(probe)) == 2
    bt.free(hold)
    assert bt.match_partial(probe, hashes[1], ids[32:39]) == 7 and len(bt.table(probe)) == 3
    bt.free(probe)
    hold = bt.allocate()
    assert bt.reserve(hold, 48)  # evicts least recently used first: the tail, then the second block
    assert list(bt._entry) == [bt._cached[hashes[0]]]


# ---- a real model ----

def _ids(vocab: int, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def _last_logits(m, ids: list[int]) -> tuple[torch.Tensor, int]:
    """The logits the engine samples the first token of `ids` from, and the position its
    prefill started at."""
    seq = _seq(0, ids, max_tokens=1)
    m.engine.add(seq)
    start, rows = None, []
    while not seq.finished:
        work = m.engine.schedule()
        start = seq.n_cached if start is None else start
        logits = m.engine.forward(work)
        rows.append(logits[[s for s, _ in work].index(seq)])
        m.engine.postprocess(work, logits)
    return rows[-1], start


@pytest.mark.parametrize("key,compute", [("qwen3moe", "packed"), ("deepseek3", "float"), ("deepseek32", "packed")])
def test_a_cached_prefix_gives_the_logits_and_tokens_of_a_full_prefill(key, compute):
    """Tolerance: the logits agree to 1e-5 of their range (float32; the suffix's prefill is a
    different batch shape, so summation order may differ), and greedy tokens are equal."""
    path = zoo().get(key).gguf("f32")
    with strata.load(path, threads=1, n_ctx=256, memory="direct", compute=compute) as on, \
            strata.load(path, threads=1, n_ctx=256, memory="direct", compute=compute, prefix_cache=False) as off:
        V = on.tokenizer.vocab_size
        turn1 = _ids(V, 90, seed=3)
        turn2 = turn1 + _ids(V, 30, seed=4)  # the second turn: the first one and more
        first = on.generate(turn1, max_tokens=4, temperature=0, stop_token_ids=())
        assert first.cached_tokens == 0
        cached, start = _last_logits(on, turn2)
        full, start_off = _last_logits(off, turn2)
        assert (start, start_off) == (90, 0)  # turn 1's five whole blocks and the 10 prompt positions after them
        span = float(full.max() - full.min())
        torch.testing.assert_close(cached, full, rtol=0, atol=1e-5 * span)
        again = on.generate(turn2, max_tokens=8, temperature=0, stop_token_ids=())
        assert again.cached_tokens == 119 and again.token_ids == off.generate(turn2, max_tokens=8,
                                                                              temperature=0, stop_token_ids=()).token_ids
        assert on.cache.n_used_blocks == 0 and on.cache.n_cached_blocks > 0 and off.cache.n_cached_blocks == 0


def test_a_tiny_kv_budget_evicts_and_outputs_stay_the_same():
    path = zoo().get("olmoe").gguf("f32")
    with strata.load(path, threads=1, n_ctx=96, max_batch=2, kv_blocks=8, memory="direct") as on, \
            strata.load(path, threads=1, n_ctx=96, max_batch=2, kv_blocks=8, memory="direct", prefix_cache=False) as off:
        V = on.tokenizer.vocab_size
        prompts = [_ids(V, 70, seed=s) for s in range(4)] * 2  # 5 blocks each: the pool caches one prompt at most
        for i, p in enumerate(prompts):
            got = on.generate(p, max_tokens=8, temperature=0, stop_token_ids=())
            assert got.token_ids == off.generate(p, max_tokens=8, temperature=0, stop_token_ids=()).token_ids, i
            assert got.cached_tokens == 0  # each prompt's blocks were evicted by the next ones
        repeat = on.generate(prompts[-1], max_tokens=8, temperature=0, stop_token_ids=())
        assert repeat.cached_tokens == 69 and on.cache.n_free_blocks == 8  # all but the last token


def test_cache_ram_keeps_prompts_cached_beyond_the_sequences_blocks():
    """kv_blocks=8 holds one 70-token prompt's blocks at most (above: each evicts the last); 2 MiB
    more for the prefix cache keeps all four, so the second pass prefills only their last tokens."""
    path = zoo().get("olmoe").gguf("f32")
    with strata.load(path, threads=1, n_ctx=96, max_batch=2, kv_blocks=8, memory="direct", cache_ram="2M") as m:
        per_block = m.cache.bytes_per_token * m.cache.block_size
        assert m.cache.n_blocks == 8 + (2 << 20) // per_block > 4 * 6
        prompts = [_ids(m.tokenizer.vocab_size, 70, seed=s) for s in range(4)]
        first = [m.generate(p, max_tokens=8, temperature=0, stop_token_ids=()) for p in prompts]
        again = [m.generate(p, max_tokens=8, temperature=0, stop_token_ids=()) for p in prompts]
        assert [c.cached_tokens for c in first] == [0] * 4 and [c.cached_tokens for c in again] == [69] * 4
        assert [c.token_ids for c in again] == [c.token_ids for c in first]


def test_cache_ram_sizes():
    from strata.engine.build import prefix_cache_blocks
    from strata.errors import StrataArgumentError
    from strata.memory.machine import Machine

    with strata.gguf.open_model(zoo().get("olmoe").gguf("f32")) as mf:
        cpu, cuda, f32 = torch.device("cpu"), torch.device("cuda"), torch.float32
        machine = Machine.cpu(64 << 30, 16 << 30)
        per_block = KVCache.bytes_for(mf.hparams.n_layers, 1, P, *cache_dims(mf.hparams), f32, n_blocks=1)
        assert prefix_cache_blocks(mf, cpu, f32, "auto", None, machine, True) == (2 << 30) // per_block  # an eighth
        assert prefix_cache_blocks(mf, cpu, f32, "auto", None, Machine.cpu(256 << 30, 200 << 30), True) == \
            prefix_cache_blocks(mf, cpu, f32, "8G", None, machine, True)  # llama-server's 8 GiB at most
        assert prefix_cache_blocks(mf, cpu, f32, "auto", "q8_0", machine, True) > \
            prefix_cache_blocks(mf, cpu, f32, "auto", None, machine, True)  # smaller blocks, more of them
        for none in [(cuda, "auto", True), (cpu, "0", True), (cpu, 0, True), (cpu, None, True), (cpu, "1G", False)]:
            assert prefix_cache_blocks(mf, none[0], f32, none[1], None, machine, none[2]) == 0, none
        with pytest.raises(StrataArgumentError, match="--cache-ram"):
            prefix_cache_blocks(mf, cpu, f32, "lots", None, machine, True)


def test_the_pool_takes_ram_as_its_blocks_are_first_used():
    """2 GiB of prefix-cache room on a tiny model: the load's resident memory grows by far less."""
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    path = zoo().get("olmoe").gguf("f32")
    before = rss()
    with strata.load(path, threads=1, n_ctx=96, max_batch=2, memory="direct", cache_ram="2G") as m:
        assert m.cache.nbytes > 2 << 30 and rss() - before < 512 << 20
        got = m.generate(_ids(m.tokenizer.vocab_size, 40, seed=9), max_tokens=4, temperature=0, stop_token_ids=())
        assert len(got.token_ids) == 4
