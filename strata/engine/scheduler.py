"""Continuous batching: which sequences run each step, and how many of their tokens.

Every step `schedule()` returns (sequence, new tokens) pairs:

1. every running sequence that decodes (one pending token) gets one token, oldest first; one that
   needs a new KV block when the pool has none preempts the youngest running sequence (itself,
   when it is the youngest): that one gives back all its blocks and returns to the front of the
   waiting queue, to be prefilled again (prompt and output so far) when blocks are free;
2. what is left of the step's token budget goes to prompt chunks: first the
   running sequences still prefilling, then waiting sequences admitted in order while fewer than
   `max_batch` run. A chunk takes what fits the budget and the free blocks (keeping one block per
   other running sequence in hand, so decodes do not preempt at once); a waiting sequence that
   gets nothing stays waiting. The budget is `max_step_tokens` (by default 2048, llama-server's and
   vLLM's batch: prompts that arrive close together are prefilled in one step and stream together),
   or while sequences decode `decoding_step_tokens` if given: a smaller one bounds the pause a
   prompt puts in running streams, at the price of more requests whose streams pause.

A waiting sequence is first matched against the prefix cache (`BlockTables.match`): the blocks
of its longest cached prefix join its table and its prefill starts after them (always leaving
its last token to compute, for its logits). After each step `computed` registers the blocks a
sequence has filled, so later requests (and this one after a preemption) can share them.

The n choices of one request share their prompt: a sequence added with `fork_of` (another
sequence of the same prompt, not yet sampled) waits on it, and when that one's prompt is
computed `fork` puts it in the running batch with the prompt's blocks shared (the partial last
one copied) and the same logits to sample its first token from; one that finds no room then (a
slot, a place in the batch, a block for the copy) waits at the front of the queue as any other.

So running decodes go on while a long prompt is prefilled beside them, a chunk per step. The
budget moves time between a request's first token and its pace, hardly its end: every step
carries every decode, and a prompt token costs about the same in a step of 128 or 2048.
`add` refuses a sequence (EngineFull) when `max_waiting` already wait.

Plain Python over `BlockTables` and `Sequence`s (no tensors, no model): tested with a fake model.
Must not: run the model or sample (the engine does).
"""
from __future__ import annotations

from collections import deque

# Tokens one step processes at most by default: running decodes (one each) plus prompt chunks.
from strata.defaults import MAX_STEP_TOKENS
from strata.errors import StrataArgumentError, StrataError

from .kv_cache import BlockTables, block_hashes
from .sequence import Sequence



class EngineFull(StrataError):
    """The waiting queue is full: the request is refused (try again later)."""


class Scheduler:
    def __init__(self, blocks: BlockTables, max_batch: int | None = None, max_step_tokens: int = MAX_STEP_TOKENS,
                 max_waiting: int | None = None, decoding_step_tokens: int | None = None):
        self.blocks = blocks
        self.max_batch = blocks.n_slots if max_batch is None else max_batch
        if not 1 <= self.max_batch <= blocks.n_slots:
            raise StrataArgumentError(f"max_batch: expected 1 to {blocks.n_slots} (the KV cache's sequence slots), "
                                      f"found {self.max_batch}")
        if max_step_tokens < self.max_batch:
            raise StrataArgumentError(f"max_step_tokens: expected at least max_batch={self.max_batch} (every running "
                                      f"sequence decodes one token per step), found {max_step_tokens}")
        if decoding_step_tokens is not None and decoding_step_tokens < 1:
            raise StrataArgumentError(f"decoding_step_tokens: expected at least 1, found {decoding_step_tokens}")
        if max_waiting is not None and max_waiting < 0:
            raise StrataArgumentError(f"max_waiting: expected >= 0 or None (unbounded), found {max_waiting}")
        self.max_step_tokens, self.max_waiting = max_step_tokens, max_waiting
        self.decoding_step_tokens = min(decoding_step_tokens or max_step_tokens, max_step_tokens)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the youngest last
        self.n_preempted = 0  # preemptions since start

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        parent = seq.fork_of
        if parent is not None and self._forkable(parent):
            parent.forks.append(seq)  # not counted as waiting: it joins with its parent's first token
            return
        seq.fork_of = None
        if self.max_waiting is not None and len(self.waiting) >= self.max_waiting:
            raise EngineFull(f"the engine's queue is full: {len(self.waiting)} requests wait (max_waiting="
                             f"{self.max_waiting}) beside {len(self.running)} running")
        self.waiting.append(seq)

    def _forkable(self, parent: Sequence) -> bool:
        """Whether `parent` has not sampled yet (its last prompt logits are still to come)."""
        return not parent.finished and not parent.output_ids and (parent in self.running or parent in self.waiting)

    def fork(self, parent: Sequence) -> list[Sequence]:
        """`parent`'s prompt is computed and its first token is sampled next: the choices waiting
        on it join the running batch sharing its prompt's blocks (to be sampled from the same
        logits); those that find no room wait at the front of the queue, to prefill as any other."""
        if parent.n_cached != len(parent.prompt_ids) or parent.output_ids:
            raise AssertionError(f"scheduler: sequence {parent.seq_id} forks only when its prompt is computed")
        joined, left = [], []
        for child in parent.forks:
            if len(self.running) < self.max_batch and self.blocks.n_free:
                child.slot = self.blocks.allocate()
                if self.blocks.fork(parent.slot, child.slot, parent.n_cached):
                    child.n_cached, child.n_prompt_cached = parent.n_cached, len(child.prompt_ids)
                    child.block_hashes, child.n_committed = list(parent.block_hashes), parent.n_committed
                    self.running.append(child)
                    joined.append(child)
                    continue
                self.blocks.free(child.slot)
                child.slot = None
            left.append(child)
        parent.forks = left
        self._unfork(parent)
        return joined

    def _unfork(self, parent: Sequence) -> None:
        """The choices still waiting on `parent` go to the front of the queue, on their own."""
        for child in reversed(parent.forks):
            child.fork_of = None
            self.waiting.appendleft(child)
        parent.forks = []

    def schedule(self) -> list[tuple[Sequence, int]]:
        """This step's work: (sequence, its new tokens), decodes first. Blocks for them are reserved."""
        for _ in range(len(self.running) + 1):
            work = self._decodes()
            budget = (self.decoding_step_tokens if work else self.max_step_tokens) - len(work)
            work += self._prefills(budget)
            if work or not self.running:
                return work
            self.preempt(self.running[-1])  # prefills hold every block and none can go on: free the youngest
        raise AssertionError("scheduler: no progress after preempting every running sequence")

    def _decodes(self) -> list[tuple[Sequence, int]]:
        work = []
        for seq in list(self.running):
            if seq.slot is None or len(seq.pending_ids) != 1:
                continue  # preempted in this loop, or still prefilling
            while not self.blocks.reserve(seq.slot, seq.n_cached + 1):
                victim = self.running[-1]  # the youngest: not scheduled yet, or seq itself
                self.preempt(victim)
                if victim is seq:
                    break
            else:
                work.append((seq, 1))
        return work

    def _prefills(self, budget: int) -> list[tuple[Sequence, int]]:
        work = []
        for seq in self.running:
            if budget > 0 and len(seq.pending_ids) > 1:
                n = self._chunk(seq, budget)
                if n:
                    work.append((seq, n))
                    budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_batch and self.blocks.n_free:
            seq = self.waiting[0]
            seq.slot = self.blocks.allocate()
            self._match(seq)
            n = self._chunk(seq, budget)
            if not n:  # no blocks to spare: it waits (blocks come back as sequences end)
                self.blocks.free(seq.slot)
                seq.slot, seq.n_cached, seq.n_committed = None, 0, 0
                break
            self._count_hits(seq)
            self.running.append(self.waiting.popleft())
            work.append((seq, n))
            budget -= n
        return work

    def _match(self, seq: Sequence) -> None:
        """Start `seq` (just given an empty table) after its longest cached prefix: whole blocks
        shared, then the positions a cached block after them starts with (copied), short of its
        last token: that one is computed for the logits the next token comes from."""
        if not self.blocks.prefix_cache:
            return
        ids, P = seq.all_ids, self.blocks.block_size
        hashes = block_hashes(ids, (len(ids) - 1) // P, seq.block_hashes, P)
        k = seq.n_committed = self.blocks.match(seq.slot, hashes)
        after = ids[k * P:min((k + 1) * P, len(ids) - 1)]  # the next block's tokens, short of the last one
        seq.n_cached = k * P + self.blocks.match_partial(seq.slot, hashes[k - 1] if k else b"", after)

    def _free(self, seq: Sequence) -> None:
        """Give back `seq`'s slot and blocks, its computed positions in its last, partly filled block
        kept as a cached tail for a prompt that goes on the same way (a repeated prompt, the next turn)."""
        P = self.blocks.block_size
        n_full, n_tail = divmod(seq.n_cached, P)
        if n_tail and self.blocks.prefix_cache:
            hashes = block_hashes(seq.all_ids, n_full, seq.block_hashes, P)
            self.blocks.keep_tail(seq.slot, hashes[n_full - 1] if n_full else b"", seq.all_ids[n_full * P:seq.n_cached])
        self.blocks.free(seq.slot)

    def _count_hits(self, seq: Sequence) -> None:
        if seq.n_prompt_cached is None:  # the first admission (not one after a preemption)
            seq.n_prompt_cached = min(seq.n_cached, len(seq.prompt_ids))
            self.blocks.n_queried += len(seq.prompt_ids)
            self.blocks.n_hit += seq.n_prompt_cached

    def computed(self, seq: Sequence) -> None:
        """`seq`'s new tokens were computed: register the blocks they filled in the prefix cache."""
        n_full = seq.n_cached // self.blocks.block_size
        if n_full > seq.n_committed and self.blocks.prefix_cache:
            hashes = block_hashes(seq.all_ids, n_full, seq.block_hashes, self.blocks.block_size)
            self.blocks.commit(seq.slot, hashes[:n_full], seq.all_ids, seq.n_committed)
            seq.n_committed = n_full

    def _chunk(self, seq: Sequence, budget: int) -> int:
        """Prompt tokens of `seq` this step (blocks reserved for them): within the budget and the
        free blocks less one kept in hand per other running sequence."""
        b = self.blocks
        others = sum(1 for s in self.running if s is not seq)
        spare = max(0, b.n_free_blocks - others)
        room = (len(b.table(seq.slot)) + spare) * b.block_size - seq.n_cached
        n = max(0, min(len(seq.pending_ids), budget, room))
        if n and not b.reserve(seq.slot, seq.n_cached + n):
            raise AssertionError(f"scheduler: {n} tokens of sequence {seq.seq_id} were counted to fit")
        return n

    def preempt(self, seq: Sequence) -> None:
        """Take `seq` out of the running batch and give back its blocks; it waits at the front of
        the queue and is prefilled again (prompt and output so far) when it is admitted."""
        self.running.remove(seq)
        self._free(seq)
        seq.slot, seq.n_cached, seq.n_committed = None, 0, 0
        self.waiting.appendleft(seq)
        self.n_preempted += 1

    def retire(self, seq: Sequence) -> None:
        """A running sequence ended: its slot and blocks go back at once."""
        self.running.remove(seq)
        self._free(seq)
        seq.slot = None

    def cancel(self, seq: Sequence) -> None:
        """End one sequence wherever it is (waiting, running, or waiting to fork), freeing its
        blocks; choices waiting to fork from it go on by themselves."""
        parent = seq.fork_of
        if parent is not None and seq in parent.forks:
            parent.forks.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.retire(seq)
        self._unfork(seq)
        seq.finish_reason = seq.finish_reason or "abort"

    def abort(self) -> None:
        """Drop every sequence (and the choices waiting to fork from them), freeing their blocks."""
        dropped = [*self.running, *self.waiting]
        dropped += [child for seq in dropped for child in seq.forks]
        for seq in list(self.running):
            self.retire(seq)
        self.waiting.clear()
        for seq in dropped:
            seq.finish_reason, seq.forks = seq.finish_reason or "abort", []


__all__ = ["EngineFull", "MAX_STEP_TOKENS", "Scheduler"]
