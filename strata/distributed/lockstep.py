"""Rank 0 leads, the other ranks follow: how a server or a benchmark runs expert-parallel.

`strata generate` runs the same generation on every rank (SPMD, rank 0's sampled tokens kept).
A server cannot: only rank 0 hears the requests, and when they arrive is a matter of timing. So
rank 0 owns the scheduler, and its runner (`LeadRunner`, in place of the model's) broadcasts each
forward pass's batch before computing it: the new tokens and, per sequence, its KV blocks, start,
length and slot. The others (`follow`) receive it and run the same forward pass on their own
model and KV cache, whose blocks then hold what rank 0's hold (every write to the cache is a
forward pass: a prefix-cache hit reuses blocks every rank wrote; recurrent state is zeroed by the
model at a sequence's position 0). Nothing else crosses: the followers sample nothing.

While rank 0 is idle it sends a heartbeat every `timeout/4` (a broadcast, then a one-number
all-reduce that every rank must answer), so a rank that dies or hangs is found within the timeout
even with no traffic, and the followers' wait for the next batch never times out by itself.
Must not: schedule or sample; it moves batches.
"""
from __future__ import annotations

from typing import Any

import torch

from strata.errors import StrataError
from strata.models import Batch

from .group import ExpertParallel, GroupError

STEP, TICK, STOP = "step", "tick", "stop"


def _check_caches(model: Any, ep: ExpertParallel) -> None:
    """Refuse ranks whose KV caches differ (rank 0's block ids must mean the same on every rank)."""
    c = model.cache
    mine = {"slots": c.n_slots, "blocks": c.n_blocks, "block_size": c.block_size, "n_ctx": c.n_ctx,
            "kv_type": c.kv_type}
    every = ep.gather(mine)
    for r, theirs in enumerate(every):
        if theirs != every[0]:
            raise StrataError(f"{model.path}: rank {r}'s KV cache {theirs} differs from rank 0's {every[0]}: "
                              "every rank needs the same --ctx, --max-batch, --kv-blocks and --kv-type")


class LeadRunner:
    """Rank 0's runner: broadcasts each call's batch, then runs it; everything else is the wrapped
    runner's. `broken`: the GroupError that ended the group, once one has."""

    def __init__(self, runner: Any, ep: ExpertParallel):
        self.inner, self.ep = runner, ep
        self.broken: GroupError | None = None
        self.tick_s = ep.timeout_s / 4

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __call__(self, tokens: torch.Tensor, batch: Batch, cache, all_logits: bool = False) -> torch.Tensor:
        return self._guard(self._step, tokens, batch, cache, all_logits)

    def _step(self, tokens, batch, cache, all_logits):
        self.ep.share((STEP, tokens.tolist(), batch.tables, batch.starts, batch.lengths, batch.slots, all_logits))
        return self.inner(tokens, batch, cache, all_logits)

    def tick(self) -> None:
        """The idle heartbeat (GroupError when a rank died or hangs)."""
        self._guard(self._tick)

    def _tick(self) -> None:
        self.ep.share((TICK,))
        self.ep.heartbeat()

    def _guard(self, fn, *args):
        if self.broken is not None:
            raise self.broken
        try:
            return fn(*args)
        except GroupError as e:
            self.broken = e
            raise

    def close(self) -> None:
        """Release the followers (unless the group is broken), then close the wrapped runner."""
        try:
            if self.broken is None:
                self.ep.share((STOP,))
        except GroupError:
            pass
        finally:
            self.inner.close()


def lead(model: Any, ep: ExpertParallel) -> Any:
    """Make `model` (a `strata.Model` loaded with `expert_parallel=ep`, on rank 0) the leader: its
    engine and its API reach the runner through a `LeadRunner`, and nothing is agreed per step."""
    _check_caches(model, ep)
    runner = LeadRunner(model.runner, ep)
    model.runner = model.engine.model = runner
    model.engine.agree = None  # the followers sample nothing
    return model


def follow(model: Any, ep: ExpertParallel) -> None:
    """Run rank 0's forward passes on this rank's model until rank 0 stops (GroupError when rank 0
    died or went silent for longer than the timeout)."""
    _check_caches(model, ep)
    runner, cache, device = model.runner, model.cache, model.device
    while True:
        msg = ep.share()
        if msg[0] == STOP:
            return
        if msg[0] == TICK:
            ep.heartbeat()
            continue
        _, ids, tables, starts, lengths, slots, all_logits = msg
        batch = Batch.make(tables, starts, lengths, cache.block_size, device, slots=slots)
        runner(torch.tensor(ids, dtype=torch.long, device=device), batch, cache, all_logits)
        model.model_file.check_intact()  # a file cut short under this rank ends it with one line, not zeros


__all__ = ["LeadRunner", "follow", "lead"]
