"""n > 1: the choices of one request fork from the first one's KV cache once its prompt is
computed (whole blocks shared, the partial last block copied), so the prompt is prefilled once,
and each choice's output equals the same seed run alone.

The scheduler tests use test_scheduler's fake model (it writes token ids into a pool and
predicts from what it reads back through the table), with a per-choice offset standing for the
seed: a block shared that should have been copied, or a copy missing, changes the outputs."""
from __future__ import annotations

import pytest

from strata.engine import BlockTables, Scheduler, Sequence
from strata.engine.sampling import SamplingParams
from strata.engine.sequence import StopConditions

from .test_scheduler import P, FakeModel, _seq

VOCAB = 97


class ForkingModel(FakeModel):
    """FakeModel that samples as the engine does: a sequence whose prompt is computed brings its
    forks, which predict from its history plus their own offset (their `seed`)."""

    def __init__(self, blocks, sched):
        super().__init__(blocks)
        self.sched, self.n_written = sched, 0
        blocks.copy_block = self.copy_block

    def copy_block(self, src, dst, n):
        for p in range(n):
            self.pool[dst, p] = self.pool[src, p]

    def step(self, work):
        sampled = []
        for seq, n in work:
            table = self.blocks.table(seq.slot)
            for p in range(seq.n_cached, seq.n_cached + n):
                self.pool[table[p // P], p % P] = seq.all_ids[p]
            self.n_written += n
            seq.n_cached += n
            if seq.n_cached == len(seq.all_ids):
                forks = self.sched.fork(seq) if seq.forks else []
                for s in (seq, *forks):
                    history = [self.pool[self.blocks.table(s.slot)[p // P], p % P] for p in range(s.n_cached)]
                    s.append((sum((i + 1) * t for i, t in enumerate(history)) + s.seq_id) * 7919 % VOCAB)
                    sampled.append(s)
        for s in sampled:
            if s.finished:
                self.sched.retire(s)
        return sampled


def _choices(n_prompt: int, n: int, max_tokens: int = 6) -> list[Sequence]:
    first = _seq(0, n_prompt, max_tokens)
    return [first] + [Sequence(i, first.prompt_ids, SamplingParams(), first.stop).fork_from(first)
                      for i in range(1, n)]


def _run(seqs, n_slots=4, max_batch=None, n_blocks=None, add=True):
    bt = BlockTables(n_slots=n_slots, n_ctx=256, n_blocks=n_blocks, block_size=P)
    sched = Scheduler(bt, max_batch, max_step_tokens=64)
    model = ForkingModel(bt, sched)
    for s in seqs if add else ():
        sched.add(s)
    return bt, sched, model


def _drive(sched, model):
    for _ in range(1000):
        if not sched.busy:
            return
        model.step(sched.schedule())
    raise AssertionError("the scheduler did not finish")


def _alone(n_prompt: int, choice: int) -> list[int]:
    seq = _seq(0, n_prompt)
    seq.seq_id = choice
    bt, sched, model = _run([seq], n_slots=1)
    _drive(sched, model)
    return seq.output_ids


@pytest.mark.parametrize("n_prompt", [1, 23, 32, 70])
def test_choices_share_the_prompt_and_equal_each_alone(n_prompt):
    seqs = _choices(n_prompt, 3)
    bt, sched, model = _run(seqs)
    _drive(sched, model)
    assert [s.output_ids for s in seqs] == [_alone(n_prompt, i) for i in range(3)]
    assert len({tuple(s.output_ids) for s in seqs}) == 3
    assert model.n_written == n_prompt + 3 * 5  # the prompt once, then 5 decodes per choice
    assert [s.n_prompt_cached for s in seqs] == [0, n_prompt, n_prompt]
    assert bt.n_free_blocks == bt.n_blocks and bt.n_free == 4


def test_fork_shares_whole_blocks_and_copies_the_partial_one():
    bt = BlockTables(n_slots=3, n_ctx=64, block_size=P, prefix_cache=False)
    copied = []
    bt.copy_block = lambda src, dst, n: copied.append((src, dst, n))
    a, b = bt.allocate(), bt.allocate()
    assert bt.reserve(a, 40) and bt.table(a) == [0, 1, 2]
    assert bt.fork(a, b, 40) and bt.table(b) == [0, 1, 3] and copied == [(2, 3, 8)]
    assert bt.n_used_blocks == 4
    bt.free(a)
    assert bt.n_used_blocks == 3  # b still holds the shared blocks
    bt.free(b)
    assert bt.n_free_blocks == bt.n_blocks
    c, d = bt.allocate(), bt.allocate()
    assert bt.reserve(c, 32) and bt.fork(c, d, 32) and bt.table(d) == bt.table(c) and len(copied) == 1


def test_fork_without_a_free_block_takes_nothing():
    bt = BlockTables(n_slots=2, n_ctx=48, n_blocks=3, block_size=P)
    a, b = bt.allocate(), bt.allocate()
    assert bt.reserve(a, 40) and bt.n_free_blocks == 0
    assert not bt.fork(a, b, 40) and bt.table(b) == [] and bt.table(a) == [0, 1, 2]


def test_choices_without_room_prefill_on_their_own():
    seqs = _choices(23, 3)
    bt, sched, model = _run(seqs, max_batch=2)  # one choice cannot join its parent's batch
    _drive(sched, model)
    assert [s.output_ids for s in seqs] == [_alone(23, i) for i in range(3)]
    assert model.n_written == 2 * 23 + 3 * 5
    assert bt.n_free_blocks == bt.n_blocks


def test_cancel_a_choice_waiting_to_fork_or_its_parent():
    seqs = _choices(40, 3)
    bt, sched, model = _run(seqs)
    model.step(sched.schedule())  # 40 of 64 tokens: the prompt is computed, the forks joined
    assert not seqs[0].forks and len(sched.running) == 3
    seqs = _choices(100, 3)
    for s in seqs:
        sched.add(s)
    sched.cancel(seqs[1])  # waiting to fork
    assert seqs[1].finish_reason == "abort" and seqs[0].forks == [seqs[2]]
    sched.cancel(seqs[0])  # the parent: its last choice goes on alone
    assert seqs[2].fork_of is None and sched.waiting[0] is seqs[2]
    _drive(sched, model)
    assert seqs[2].output_ids == _alone(100, 2)
    assert bt.n_free_blocks == bt.n_blocks


def test_a_choice_added_after_its_parent_sampled_runs_alone():
    first = _seq(0, 10)
    bt, sched, model = _run([first])
    model.step(sched.schedule())
    late = Sequence(1, first.prompt_ids, SamplingParams(), first.stop).fork_from(first)
    sched.add(late)
    assert late.fork_of is None and late in sched.waiting
    _drive(sched, model)
    assert late.output_ids == _alone(10, 1)


def test_abort_ends_the_choices_waiting_to_fork():
    seqs = _choices(40, 3)
    bt, sched, model = _run(seqs)
    sched.abort()
    assert all(s.finish_reason == "abort" for s in seqs) and not sched.busy


def test_fork_from_another_prompt_is_refused():
    a = _seq(0, 5)
    with pytest.raises(ValueError, match="same prompt"):
        Sequence(1, [1, 2], SamplingParams(), StopConditions()).fork_from(a)


# ---- the engine, on the tiny model ----

@pytest.fixture(scope="module")
def tiny_file():
    from tests.fixtures.tiny import zoo

    return zoo().get("qwen3moe").gguf("f32")


@pytest.mark.parametrize("n_prompt, prefix_cache, kv_type", [(23, True, "f32"), (32, False, "f32"),
                                                             (23, False, "q8_0")])
def test_n_choices_prefill_once_and_equal_separate_requests(tiny_file, n_prompt, prefix_cache, kv_type):
    import strata

    with strata.load(tiny_file, threads=1, max_batch=4, prefix_cache=prefix_cache, kv_type=kv_type) as m:
        ids = [(7 * i + 3) % 500 + 10 for i in range(n_prompt)]
        before = m.engine.n_prefilled
        choices = m.generate(ids, n=3, temperature=1.0, seed=5, max_tokens=12, stop_token_ids=())
        assert m.engine.n_prefilled - before == n_prompt  # prefilled once, not once per choice
        alone = [m.generate(ids, temperature=1.0, seed=5 + i, max_tokens=12, stop_token_ids=()).token_ids
                 for i in range(3)]
        assert [c.token_ids for c in choices] == alone and len({tuple(a) for a in alone}) == 3
        assert m.cache.n_used_blocks == 0 or prefix_cache


def test_fork_copies_the_recurrent_state_and_no_block_copy_touches_it():
    """A recurrent layer (qwen3next's DeltaNet) keeps one state row per slot: a fork gives the
    child a copy of the parent's row, and copying the partial KV block leaves every state row alone."""
    import torch

    from strata.engine.kv_cache import KVCache

    cache = KVCache(3, 4, 64, 2, 8, block_size=16, prefix_cache=False, states={1: ((4, 3), (2, 5, 5))})
    src, dst = cache.allocate(), cache.allocate()
    cache.reserve(src, 21)  # one whole block and a partial one
    for t in (cache.k[1], cache.v[1]):
        t.copy_(torch.randn_like(t))
    others = [t[2:].clone() for t in (cache.k[1], cache.v[1])]
    assert cache.fork(src, dst, 21)
    assert torch.equal(cache.k[1][dst], cache.k[1][src]) and torch.equal(cache.v[1][dst], cache.v[1][src])
    assert all(torch.equal(t[2:], o) for t, o in zip((cache.k[1], cache.v[1]), others))
