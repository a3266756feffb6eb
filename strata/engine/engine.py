"""The decode loop: each step the scheduler picks the work, the model runs it, sequences sample.

`step()` reads like its spec: `schedule()` (strata.engine.scheduler) returns every running
decode (one token each) and prompt chunks under the step's token budget, as (sequence, new
tokens) pairs; `forward()` runs the model once over that mixed batch (sequences of different
lengths in one flattened token axis, each reading its own blocks of the paged KV cache);
`postprocess()` samples for the sequences whose pending tokens are all cached now (a prompt's
middle chunk samples nothing), appends and retires finished ones, freeing their blocks. A
sequence whose prompt is just computed brings the choices forked from it (n > 1), which sample
their first tokens from its logits row.

Must not do model maths or touch weights: it schedules, calls `forward` and samples.
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch

from strata.errors import StrataError
from strata.models import Batch
from strata.runtime import Runner

from .kv_cache import KVCache
from .sampling import sample_batch
from .scheduler import MAX_STEP_TOKENS, EngineFull, Scheduler
from .sequence import Sequence


class Engine:
    """Continuous batching over a model and its paged KV cache.

    max_batch: sequences running at once (default: the cache's slots); max_step_tokens: tokens one
    step processes at most (decodes plus prompt chunks), decoding_step_tokens while sequences
    decode (`Scheduler`); max_waiting: sequences that may wait (None: unbounded; past it `add`
    raises EngineFull); agree: the picks of a step -> the picks every rank keeps (expert
    parallelism: rank 0's, so the ranks' sequences cannot diverge); check: called after each forward
    pass (and when one fails), raising when the model's file was cut short under it (`ModelFile.
    check_intact`: pages read past its end read zeros), so such logits never reach a sampler and
    the error names the file rather than whichever read failed."""

    def __init__(self, model: Runner, cache: KVCache, device: torch.device, max_batch: int | None = None,
                 max_step_tokens: int = MAX_STEP_TOKENS, max_waiting: int | None = None, agree=None,
                 decoding_step_tokens: int | None = None, check: Callable[[], None] | None = None):
        self.model, self.cache, self.device, self.agree = model, cache, device, agree
        self.check = check or (lambda: None)
        self.scheduler = Scheduler(cache, max_batch, max_step_tokens, max_waiting, decoding_step_tokens)
        self.n_prefilled = 0  # prompt positions computed since start (not those a cache or a fork served)

    @property
    def n_ctx(self) -> int:
        return self.cache.n_ctx

    @property
    def waiting(self):
        return self.scheduler.waiting

    @property
    def running(self) -> list[Sequence]:
        return self.scheduler.running

    def add(self, seq: Sequence) -> None:
        """Queue a sequence; StrataError when its prompt leaves no room in the context, EngineFull
        when `max_waiting` sequences already wait."""
        n = len(seq.prompt_ids)
        if n >= self.n_ctx:
            raise StrataError(f"prompt of {n} tokens does not fit the context of {self.n_ctx} tokens "
                              "(room for at least one generated token is needed)")
        self.scheduler.add(seq)

    @property
    def busy(self) -> bool:
        return self.scheduler.busy

    def run(self) -> Iterator[tuple[Sequence, str]]:
        """Step until every sequence has finished, yielding (sequence, new visible text) per token."""
        while self.busy:
            yield from self.step()

    def step(self) -> list[tuple[Sequence, str]]:
        work = self.schedule()
        if not work:
            return []
        logits = self.forward(work)  # [B, V]
        return self.postprocess(work, logits)

    def schedule(self) -> list[tuple[Sequence, int]]:
        return self.scheduler.schedule()

    def forward(self, work: list[tuple[Sequence, int]]) -> torch.Tensor:
        ids = [s.all_ids[s.n_cached:s.n_cached + n] for s, n in work]
        tokens = torch.tensor([t for chunk in ids for t in chunk], dtype=torch.long, device=self.device)  # [T]
        batch = Batch.make([self.cache.table(s.slot) for s, _ in work], [s.n_cached for s, _ in work],
                           [n for _, n in work], self.cache.block_size, self.device, slots=[s.slot for s, _ in work])
        logits = self.run_model(tokens, batch)  # [B, V]
        for s, n in work:
            self.n_prefilled += max(0, min(s.n_cached + n, len(s.prompt_ids)) - s.n_cached)
            s.n_cached += n
            self.scheduler.computed(s)
        return logits.cpu()

    def run_model(self, tokens: torch.Tensor, batch: Batch, all_logits: bool = False) -> torch.Tensor:
        """One forward pass, checked (`check`) after it and when it fails."""
        try:
            logits = self.model(tokens, batch, self.cache, all_logits=all_logits)
        except StrataError:
            self.check()  # a read that failed as the file shrank: say that, naming the file
            raise
        self.check()
        return logits

    def postprocess(self, work: list[tuple[Sequence, int]], logits: torch.Tensor) -> list[tuple[Sequence, str]]:
        """Sample the sequences whose pending tokens are all cached (one batched call: penalties,
        bias and log-probabilities vectorised), append, and retire the finished ones."""
        ready = [i for i, (seq, _) in enumerate(work) if seq.n_cached >= len(seq.all_ids)]  # a middle chunk waits
        if not ready:
            return []
        rows, seqs = [], []
        for i in ready:
            seq = work[i][0]
            forks = self.scheduler.fork(seq) if seq.forks else []  # its other choices: same prompt, same logits
            rows += [i] * (1 + len(forks))
            seqs += [seq, *forks]
        picks = sample_batch(logits[rows], [s.sampler for s in seqs], [s.all_ids for s in seqs],
                             [len(s.prompt_ids) for s in seqs])
        if self.agree is not None:
            picks = self.agree(picks)
        out = []
        for seq, (token, logprob) in zip(seqs, picks):
            text = seq.append(token, logprob)
            if not seq.finished and len(seq.all_ids) >= self.n_ctx:
                text += seq.finish("length")  # the next token would not fit the cache
            out.append((seq, text))
            if seq.finished:
                self.scheduler.retire(seq)
        return out

    def cancel(self, seq: Sequence) -> None:
        """End one sequence wherever it is (waiting or running); its KV blocks are free at once."""
        self.scheduler.cancel(seq)

    def abort(self) -> None:
        """Drop every sequence (e.g. after Ctrl-C), freeing their blocks."""
        self.scheduler.abort()


__all__ = ["Engine", "EngineFull", "MAX_STEP_TOKENS"]
