"""The decode loop: admit sequences, prefill them, decode all running ones together.

`step()` reads like its spec: `schedule()` picks either the waiting sequences that fit (a prefill
step: their whole prompts, several sequences of different lengths in one flattened batch) or,
when none wait, every running sequence (a decode step: one token each); `forward()` runs the
model over the batch and `postprocess()` samples, appends and retires finished sequences.

Must not do model maths or touch weights: it schedules, calls `forward` and samples.
"""
from __future__ import annotations

from collections import deque
from typing import Iterator

import torch

from strata.errors import StrataError
from strata.models import Batch, Transformer

from .kv_cache import KVCache
from .sequence import Sequence

#: New tokens one prefill step takes at most (sequences are admitted whole until this is reached).
MAX_PREFILL_TOKENS = 4096


class Engine:
    def __init__(self, model: Transformer, cache: KVCache, device: torch.device,
                 max_prefill_tokens: int = MAX_PREFILL_TOKENS):
        self.model, self.cache, self.device = model, cache, device
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def n_ctx(self) -> int:
        return self.cache.n_ctx

    def add(self, seq: Sequence) -> None:
        n = len(seq.prompt_ids)
        if n >= self.n_ctx:
            raise StrataError(f"prompt of {n} tokens does not fit the context of {self.n_ctx} tokens "
                              "(room for at least one generated token is needed)")
        self.waiting.append(seq)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def run(self) -> Iterator[tuple[Sequence, str]]:
        """Step until every sequence has finished, yielding (sequence, new visible text) per token."""
        while self.busy:
            yield from self.step()

    def step(self) -> list[tuple[Sequence, str]]:
        seqs = self.schedule()
        logits = self.forward(seqs)  # [B, V]
        return self.postprocess(seqs, logits)

    def schedule(self) -> list[Sequence]:
        admitted, n_tokens = [], 0
        while self.waiting and self.cache.n_free and (
                not admitted or n_tokens + len(self.waiting[0].prompt_ids) <= self.max_prefill_tokens):
            seq = self.waiting.popleft()
            seq.slot = self.cache.allocate()
            admitted.append(seq)
            n_tokens += len(seq.prompt_ids)
        if admitted:
            self.running.extend(admitted)
            return admitted
        return list(self.running)

    def forward(self, seqs: list[Sequence]) -> torch.Tensor:
        pending = [s.pending_ids for s in seqs]
        tokens = torch.tensor([t for p in pending for t in p], dtype=torch.long, device=self.device)  # [T]
        batch = Batch.make([s.slot for s in seqs], [s.n_cached for s in seqs], [len(p) for p in pending], self.device)
        logits = self.model(tokens, batch, self.cache)  # [B, V]
        for s, p in zip(seqs, pending):
            s.n_cached += len(p)
        return logits.cpu()

    def postprocess(self, seqs: list[Sequence], logits: torch.Tensor) -> list[tuple[Sequence, str]]:
        out = []
        for seq, row in zip(seqs, logits):
            text = seq.append(seq.sampler(row, seq.all_ids))
            if not seq.finished and len(seq.all_ids) >= self.n_ctx:
                text += seq.finish("length")  # the next token would not fit the cache
            out.append((seq, text))
            if seq.finished:
                self.retire(seq)
        return out

    def retire(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.cache.free(seq.slot)
        seq.slot = None

    def cancel(self, seq: Sequence) -> None:
        """End one sequence wherever it is (waiting or running), freeing its slot."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.retire(seq)
        seq.finish_reason = seq.finish_reason or "abort"

    def abort(self) -> None:
        """Drop every sequence (e.g. after Ctrl-C), freeing their slots."""
        for seq in list(self.running):
            seq.finish_reason = seq.finish_reason or "abort"
            self.retire(seq)
        for seq in self.waiting:
            seq.finish_reason = seq.finish_reason or "abort"
        self.waiting.clear()


__all__ = ["Engine", "MAX_PREFILL_TOKENS"]
