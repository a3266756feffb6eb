"""The paged KV cache's bookkeeping (BlockTables) and the scheduler, without a model.

A fake model stands in for the transformer: it writes each new token's id into the block and
offset its sequence's table gives, and "predicts" the next token from the ids it reads back
through the table. A block shared by two sequences, a lost block or a chunk scheduled twice
changes the prediction, so outputs equal to each sequence run alone mean the tables held.
"""
from __future__ import annotations

import random

import pytest

from strata.engine import BlockTables, EngineFull, Scheduler, Sequence
from strata.engine.sampling import SamplingParams
from strata.engine.sequence import StopConditions
from strata.errors import StrataArgumentError, StrataError

P = 16  # BLOCK_SIZE


# ---- block tables ----

def test_blocks_are_reserved_as_a_sequence_grows_and_come_back_when_it_ends():
    bt = BlockTables(n_slots=3, n_ctx=64, block_size=P)  # 4 blocks per full sequence, 12 in all
    assert (bt.n_blocks, bt.max_blocks, bt.n_free_blocks) == (12, 4, 12)
    a, b = bt.allocate(), bt.allocate()
    assert (a, b) == (0, 1) and bt.table(a) == []
    assert bt.reserve(a, 1) and bt.table(a) == [0]
    assert bt.reserve(a, 16) and bt.table(a) == [0]  # still inside block 0
    assert bt.reserve(a, 17) and bt.table(a) == [0, 1]
    assert bt.reserve(b, 40) and bt.table(b) == [2, 3, 4]
    assert bt.n_used_blocks == 5 and bt.blocks_needed(a, 64) == 2
    bt.free(a)
    assert bt.n_free_blocks == 9 and bt.n_free == 2
    c = bt.allocate()
    assert c == 0 and bt.reserve(c, 33) and bt.table(c) == [0, 1, 5]  # freed blocks are reused first
    with pytest.raises(StrataError, match="exceed n_ctx=64"):
        bt.reserve(c, 65)
    with pytest.raises(ValueError, match="not allocated"):
        bt.free(2)


def test_an_exhausted_pool_refuses_all_or_nothing():
    bt = BlockTables(n_slots=4, n_ctx=48, n_blocks=5, block_size=P)  # room for 80 positions in all
    a, b = bt.allocate(), bt.allocate()
    assert bt.reserve(a, 48)  # 3 blocks
    assert not bt.reserve(b, 48) and bt.table(b) == [] and bt.n_free_blocks == 2  # nothing taken
    assert not bt.can_reserve(b, 33) and bt.can_reserve(b, 32) and bt.reserve(b, 32)
    assert bt.n_free_blocks == 0 and not bt.reserve(b, 33)
    bt.release(a)  # a preempted sequence keeps its slot, gives its blocks back
    assert bt.table(a) == [] and bt.n_free_blocks == 3 and bt.reserve(b, 48)
    bt.allocate(), bt.allocate()
    with pytest.raises(StrataError, match="all 4 sequence slots"):
        bt.allocate()


def test_a_pool_must_hold_one_full_context_sequence():
    with pytest.raises(StrataError, match="cannot hold one sequence of n_ctx=100"):
        BlockTables(n_slots=2, n_ctx=100, n_blocks=6, block_size=P)  # 7 blocks needed
    assert BlockTables(n_slots=2, n_ctx=100, n_blocks=7, block_size=P).n_blocks == 7


def test_no_block_leaks_after_many_sequences():
    rng = random.Random(0)
    bt = BlockTables(n_slots=8, n_ctx=256, n_blocks=40, block_size=P)
    live: dict[int, int] = {}  # slot -> positions held
    for _ in range(3000):
        op = rng.random()
        if op < 0.3 and bt.n_free:
            live[bt.allocate()] = 0
        elif op < 0.8 and live:
            slot = rng.choice(list(live))
            n = min(256, live[slot] + rng.randint(1, 40))
            if bt.reserve(slot, n):
                live[slot] = n
        elif live:
            bt.free(slot := rng.choice(list(live)))
            del live[slot]
        held = [blk for slot in live for blk in bt.table(slot)]
        assert len(held) == len(set(held)) == bt.n_used_blocks  # no block in two tables, none lost
        assert all(len(bt.table(s)) == -(-n // P) for s, n in live.items())
    for slot in list(live):
        bt.free(slot)
    assert bt.n_free_blocks == bt.n_blocks == 40 and bt.n_free == 8


# ---- the scheduler over a fake model ----

class FakeModel:
    """Writes token ids into a dict standing for the KV pool; predicts from what it reads back."""

    def __init__(self, blocks: BlockTables, vocab: int = 97):
        self.blocks, self.vocab, self.pool = blocks, vocab, {}

    def step(self, work: list[tuple[Sequence, int]]) -> list[Sequence]:
        """Runs one scheduled step as the engine does; returns the sequences that sampled."""
        sampled = []
        for seq, n in work:
            table = self.blocks.table(seq.slot)
            assert len(table) * P >= seq.n_cached + n, "blocks were not reserved for the chunk"
            for p in range(seq.n_cached, seq.n_cached + n):
                self.pool[table[p // P], p % P] = seq.all_ids[p]
            seq.n_cached += n
            if seq.n_cached == len(seq.all_ids):
                history = [self.pool[table[p // P], p % P] for p in range(seq.n_cached)]
                seq.append(sum((i + 1) * t for i, t in enumerate(history)) * 7919 % self.vocab)
                sampled.append(seq)
        return sampled


def _seq(i: int, n_prompt: int, max_tokens: int = 6) -> Sequence:
    rng = random.Random(i)
    return Sequence(i, [rng.randrange(97) for _ in range(n_prompt)], SamplingParams(),
                    StopConditions(max_tokens=max_tokens, stop_token_ids=frozenset()))


def _drive(sched: Scheduler, model: FakeModel, steps: list | None = None, max_steps: int = 10_000):
    """Steps until idle; `steps` collects (work as (seq_id, n), sampled seq_ids) per step."""
    for _ in range(max_steps):
        if not sched.busy:
            return
        work = sched.schedule()
        assert work, "a busy scheduler scheduled nothing"
        assert sum(n for _, n in work) <= sched.max_step_tokens
        assert len(sched.running) <= sched.max_batch
        sampled = model.step(work)
        for seq in sampled:
            if seq.finished:
                sched.retire(seq)
        if steps is not None:
            steps.append(([(s.seq_id, n) for s, n in work], [s.seq_id for s in sampled]))
    raise AssertionError("the scheduler did not finish")


def _alone(n_prompt: int, i: int, max_tokens: int = 6) -> list[int]:
    bt = BlockTables(n_slots=1, n_ctx=2048, block_size=P)
    sched, seq = Scheduler(bt, max_step_tokens=512), _seq(i, n_prompt, max_tokens)
    sched.add(seq)
    _drive(sched, FakeModel(bt))
    return seq.output_ids


def test_sixteen_sequences_together_give_their_outputs_alone():
    lengths = [1, 3, 17, 900, 40, 5, 333, 16, 64, 2, 700, 31, 128, 9, 48, 250]
    bt = BlockTables(n_slots=16, n_ctx=2048, block_size=P)
    sched = Scheduler(bt, max_step_tokens=512)
    seqs = [_seq(i, n) for i, n in enumerate(lengths)]
    for s in seqs:
        sched.add(s)
    steps = []
    _drive(sched, FakeModel(bt), steps)
    assert [s.output_ids for s in seqs] == [_alone(n, i) for i, n in enumerate(lengths)]
    assert max(n for work, _ in steps for _, n in work) <= 512 and len(steps) > 5  # prompts were chunked
    assert bt.n_free_blocks == bt.n_blocks and bt.n_free == 16 and sched.n_preempted == 0


def test_prompts_that_arrive_together_are_prefilled_in_one_step_and_stream_together():
    """By default a step takes 2048 tokens (llama-server's and vLLM's batch): four prompts of 400
    are one step, and all four sample their first token after it. decoding_step_tokens bounds
    only the steps beside decodes, so they arrive together the same way."""
    for decoding in (None, 512):
        bt = BlockTables(n_slots=4, n_ctx=1024, block_size=P)
        sched = Scheduler(bt, decoding_step_tokens=decoding)
        assert sched.max_step_tokens == 2048
        seqs = [_seq(i, 400) for i in range(4)]
        for s in seqs:
            sched.add(s)
        steps = []
        _drive(sched, FakeModel(bt), steps)
        assert steps[0] == ([(i, 400) for i in range(4)], [0, 1, 2, 3])
        assert [s.output_ids for s in seqs] == [_alone(400, i) for i in range(4)]


def test_a_long_prompt_does_not_stall_running_decodes():
    """Four streams decode; a 1500-token prompt arrives. Every step still carries one token of
    each stream: the longest gap between two of their tokens is one step, with at most
    decoding_step_tokens - 4 prompt tokens of prefill work in it (the whole prompt would be 1500)."""
    bt = BlockTables(n_slots=5, n_ctx=2048, block_size=P)
    sched = Scheduler(bt, max_step_tokens=2048, decoding_step_tokens=512)
    streams = [_seq(i, 8 + i, max_tokens=40) for i in range(4)]
    for s in streams:
        sched.add(s)
    model = FakeModel(bt)
    for _ in range(3):
        model.step(sched.schedule())
    long = _seq(9, 1500, max_tokens=2)
    sched.add(long)
    last_token = {s.seq_id: 0 for s in streams}
    gaps, prefill_between = [], []
    step = 0
    while not long.output_ids:
        step += 1
        work = sched.schedule()
        prefill = sum(n for s, n in work if s is long)
        for seq in model.step(work):
            if seq.seq_id in last_token:
                gaps.append(step - last_token[seq.seq_id])
                prefill_between.append(prefill)
                last_token[seq.seq_id] = step
    assert step == 3  # 508 + 508 + 484 prompt tokens beside the four decodes
    assert len(gaps) == 12 and max(gaps) == 1 and max(prefill_between) == 508 < 1500


def test_a_small_pool_preempts_the_youngest_and_outputs_stay_the_same():
    lengths = [100, 90, 80, 70, 60, 50]
    bt = BlockTables(n_slots=6, n_ctx=160, n_blocks=12, block_size=P)  # 192 positions for 6 sequences
    sched = Scheduler(bt, max_step_tokens=64)
    seqs = [_seq(i, n, max_tokens=40) for i, n in enumerate(lengths)]
    for s in seqs:
        sched.add(s)
    _drive(sched, FakeModel(bt))
    assert sched.n_preempted > 0
    alone = []
    for i, n in enumerate(lengths):
        one = BlockTables(n_slots=1, n_ctx=160, block_size=P)
        s1, seq = Scheduler(one, max_step_tokens=64), _seq(i, n, max_tokens=40)
        s1.add(seq)
        _drive(s1, FakeModel(one))
        alone.append(seq.output_ids)
    assert [s.output_ids for s in seqs] == alone
    assert bt.n_free_blocks == 12 and bt.n_free == 6


def test_the_waiting_queue_is_bounded_and_max_batch_holds():
    bt = BlockTables(n_slots=4, n_ctx=64, block_size=P)
    sched = Scheduler(bt, max_batch=2, max_step_tokens=32, max_waiting=3)
    seqs = [_seq(i, 20) for i in range(5)]
    for s in seqs[:3]:
        sched.add(s)
    with pytest.raises(EngineFull, match="max_waiting=3"):
        sched.add(seqs[3])
    work = sched.schedule()  # 20 + 12 tokens: the second prompt's first chunk
    assert [(s.seq_id, n) for s, n in work] == [(0, 20), (1, 12)] and len(sched.running) == 2
    sched.add(seqs[3])
    sched.add(seqs[4])  # two admitted, so three wait again
    with pytest.raises(EngineFull):
        sched.add(_seq(5, 3))
    assert issubclass(EngineFull, StrataError)


def test_cancel_frees_blocks_at_once():
    bt = BlockTables(n_slots=3, n_ctx=128, block_size=P)
    sched, model = Scheduler(bt, max_step_tokens=64), FakeModel(bt)
    a, b, c = _seq(0, 40, 50), _seq(1, 10, 50), _seq(2, 5, 50)
    for s in (a, b, c):
        sched.add(s)
    model.step(sched.schedule())
    held = len(bt.table(a.slot))
    free = bt.n_free_blocks
    sched.cancel(a)  # running
    assert bt.n_free_blocks == free + held == bt.n_blocks - len(bt.table(b.slot)) - len(bt.table(c.slot))
    assert a.finish_reason == "abort" and a not in sched.running and a.slot is None
    d = _seq(3, 5)
    sched.add(d)
    sched.cancel(d)  # waiting
    assert d.finish_reason == "abort" and not sched.waiting
    sched.abort()
    assert bt.n_free_blocks == bt.n_blocks and bt.n_free == 3 and not sched.busy


def test_scheduler_arguments_are_checked():
    bt = BlockTables(n_slots=4, n_ctx=64, block_size=P)
    with pytest.raises(StrataArgumentError, match="max_step_tokens"):
        Scheduler(bt, max_step_tokens=3)
    with pytest.raises(StrataArgumentError, match="max_batch"):
        Scheduler(bt, max_batch=5)
    with pytest.raises(StrataArgumentError, match="max_waiting"):
        Scheduler(bt, max_waiting=-1)
    with pytest.raises(StrataArgumentError, match="decoding_step_tokens"):
        Scheduler(bt, decoding_step_tokens=0)
    assert Scheduler(bt, max_step_tokens=64, decoding_step_tokens=512).decoding_step_tokens == 64
