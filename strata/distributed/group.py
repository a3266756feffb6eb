"""One rank of an expert-parallel group on torch.distributed (gloo), and its collectives.

SPMD: every rank runs the same engine on the same requests; each computes attention, routers and
shared experts for every token and only its shard of the routed experts (`strata.models.shard`).
Per MoE layer one all-gather brings every rank's partial sum [T, D] and each rank adds them in rank
order (0, 1, ...): the same bytes on every rank, whatever the timing. Ranks that all run on one
machine exchange them through shared memory instead (`shared.SharedSums`, set up in `ready`: the
same additions, without gloo's cost per call). That order is not the one process's (which adds a
token's experts in ascending expert order), so logits agree with one process's to float rounding
(tests/distributed bound them), not bit for bit. Each step the ranks keep rank 0's sampled tokens
(`agree`), so they cannot diverge. A collective that waits longer than `timeout_s` (a rank died or
hangs) raises on the others instead of hanging.

`counters()` says what this rank moved over the group: the all-gathers' payload ((world - 1) partial
sums of [T, D] sent and as many received per MoE layer, whatever algorithm gloo runs: a ring
forwards each block once, a direct exchange sends it to each peer), rank 0's broadcasts of the
sampled tokens (their pickled payload), and the seconds spent in the all-gathers (waiting for the
slowest rank included).
"""
from __future__ import annotations

import os
import pickle
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from strata import native
from strata.errors import StrataError
from strata.gguf import ModelFile
from strata.models.shard import ExpertShard

from .plan import ShardPlan, file_checksum, shard_plan
from .shared import SharedSums

class GroupError(StrataError):
    """A collective failed: a rank died or did not answer in time. The group cannot go on (`fatal`:
    a server stops rather than serve from a broken group)."""

    fatal = True


#: Seconds a collective waits for the other ranks before it fails (a dead or hung rank).
DEFAULT_TIMEOUT_S = 60.0
#: Seconds the ranks wait for each other while starting (rendezvous, the start-up check, the end of
#: loading): ranks start and load at different speeds (a cold file on a slower disk), so start-up
#: is not held to the step timeout.
STARTUP_TIMEOUT_S = 900.0
ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class NetCounters:
    """What one rank moved over the group since start: the MoE layers' all-gathers (calls, rows:
    the tokens of each call summed, payload bytes sent and received, seconds inside them) and
    rank 0's broadcasts of each step's tokens (control bytes: the pickled payload sent or received)."""

    calls: int = 0
    shared_calls: int = 0  # of the calls, those through shared memory (ranks on one machine)
    rows: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    collective_s: float = 0.0
    control_bytes: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


class ExpertParallel:
    """This process's rank of an initialised gloo group; `replicate_hot`: see `shard_plan`."""

    def __init__(self, rank: int, world_size: int, replicate_hot: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S,
                 steps: object = None):
        """`steps`: the process group of the steps' collectives, whose timeout is `timeout_s` (None:
        the default group, as a test's hand-made group has)."""
        self.rank, self.world_size, self.replicate_hot, self.timeout_s = rank, world_size, replicate_hot, timeout_s
        self.steps = steps
        self.net = NetCounters()
        self.broken = False  # a collective failed: the group cannot go on, nor be torn down cleanly
        self.shared: SharedSums | None = None  # the partial sums' shared segment (ready: ranks on one machine)

    @staticmethod
    def from_env(replicate_hot: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S) -> ExpertParallel:
        """Join the group torchrun describes in the environment (RANK, WORLD_SIZE, MASTER_ADDR,
        MASTER_PORT); a one-line error when a variable is missing."""
        missing = [k for k in ENV if k not in os.environ]
        if missing:
            raise StrataError(f"--expert-parallel: {', '.join(missing)} not set; launch with "
                              "torchrun --nproc-per-node N -m strata ... (or set them for each rank)")
        startup = max(timeout_s, STARTUP_TIMEOUT_S)
        try:
            if not dist.is_initialized():
                dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=startup))
            steps = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        except (RuntimeError, ValueError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise StrataError(f"expert parallelism: rank {os.environ['RANK']} could not join the group at "
                              f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} within {startup:g} s: {first}") from None
        return ExpertParallel(dist.get_rank(), dist.get_world_size(), replicate_hot, timeout_s, steps)

    @property
    def collective_seconds(self) -> float:
        return self.net.collective_s

    def counters(self) -> dict:
        """This rank's `NetCounters` since start, as a dict (plain numbers)."""
        return self.net.to_dict()

    def plan(self, mf: ModelFile) -> ShardPlan:
        return shard_plan(mf, self.world_size, self.replicate_hot)

    def shards(self, mf: ModelFile) -> dict[int, ExpertShard]:
        """This rank's `ExpertShard` of each MoE layer, once every rank agrees on the file and plan."""
        plan = self.plan(mf)
        self.check_same(mf, plan)
        return {layer: ExpertShard(plan.owners[i], self.rank, self.combine) for i, layer in enumerate(plan.layers)}

    def check_same(self, mf: ModelFile, plan: ShardPlan) -> None:
        """Refuse, on every rank, a group whose ranks opened different files or made different plans."""
        mine = (file_checksum(mf), plan.checksum())
        every: list = [None] * self.world_size
        with self._failing("the start-up check", STARTUP_TIMEOUT_S):
            dist.all_gather_object(every, mine)
        for r, (file_cs, plan_cs) in enumerate(every):
            if file_cs != every[0][0]:
                raise StrataError(f"{mf.path}: rank {r}'s file (header checksum {file_cs}) differs from rank 0's "
                                  f"({every[0][0]}): every rank must load the same GGUF file")
            if plan_cs != every[0][1]:
                raise StrataError(f"{mf.path}: rank {r}'s shard plan (checksum {plan_cs}) differs from rank 0's "
                                  f"({every[0][1]}): every rank needs the same --replicate-hot")

    def least(self, value: int) -> int:
        """The smallest of every rank's `value` (a size each rank sized from its own machine, such
        as the prefix cache's blocks under --cache-ram auto, which the ranks must share)."""
        every: list = [None] * self.world_size
        with self._failing("the start-up agreement on sizes", STARTUP_TIMEOUT_S):
            dist.all_gather_object(every, int(value))
        return min(every)

    def ready(self) -> None:
        """Wait, up to the start-up timeout, until every rank has loaded: the steps' collectives
        then hold each other to the step timeout only."""
        with self._failing("waiting for every rank to load", STARTUP_TIMEOUT_S):
            dist.barrier()
            if self.shared is None:
                self.shared = SharedSums.open(self)

    def combine(self, partial: torch.Tensor) -> torch.Tensor:
        """[T, D] partial sums of every rank, added in rank order: the same tensor on every rank."""
        t0 = time.perf_counter()
        net = self.net
        shared = self.shared
        if shared is not None and partial.dtype == torch.float32 and partial.device.type == "cpu" \
                and partial.numel() <= shared.slot_floats:
            out = self._shared_sum(shared, partial.contiguous())
            net.shared_calls += 1
        else:
            parts = [torch.empty_like(partial) for _ in range(self.world_size)]
            with self._failing("a MoE layer's all-gather"):
                dist.all_gather(parts, partial.contiguous(), group=self.steps)
            out = parts[0]
            for p in parts[1:]:
                out = out + p
        n, peers = partial.numel() * partial.element_size(), self.world_size - 1
        net.collective_s += time.perf_counter() - t0
        net.calls, net.rows = net.calls + 1, net.rows + partial.shape[0]
        net.bytes_sent, net.bytes_received = net.bytes_sent + peers * n, net.bytes_received + peers * n
        return out

    def _shared_sum(self, shared: SharedSums, partial: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(partial)
        shared.seq += 1
        try:
            shared.exchange.sum(shared.seq, partial, out, self.timeout_s)
        except native.ExchangeError as e:
            self.broken = True
            _BROKEN.append(self.rank)
            raise GroupError(f"expert parallelism: rank {self.rank} of {self.world_size}: a MoE layer's exchange "
                             f"failed (another rank died or did not answer within {self.timeout_s:g} s): {e}") from None
        return out

    def agree(self, picks: list) -> list:
        """Rank 0's picks of a step (token, log-probabilities) on every rank."""
        box = [picks if self.rank == 0 else None]
        with self._failing("the broadcast of rank 0's tokens"):
            dist.broadcast_object_list(box, src=0, group=self.steps)
        size = 8 + len(pickle.dumps(box[0]))  # the payload and its int64 length, as broadcast_object_list sends them
        self.net.control_bytes += size * (self.world_size - 1) if self.rank == 0 else size
        return box[0]

    def share(self, obj=None):
        """Rank 0's `obj` on every rank (what the others pass is ignored)."""
        box = [obj if self.rank == 0 else None]
        with self._failing("a broadcast from rank 0"):
            dist.broadcast_object_list(box, src=0, group=self.steps)
        return box[0]

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        every: list = [None] * self.world_size
        with self._failing("an all-gather of the ranks' settings"):
            dist.all_gather_object(every, obj, group=self.steps)
        return every

    def heartbeat(self) -> None:
        """A one-number all-reduce: returns once every rank has answered (a broadcast alone would not
        notice a rank that hangs), raises GroupError after the timeout."""
        with self._failing("a heartbeat"):
            dist.all_reduce(torch.zeros(1), group=self.steps)

    @contextmanager
    def _failing(self, what: str, timeout_s: float | None = None):
        """A collective's failure (a rank died, or did not answer within the timeout) as one line."""
        try:
            yield
        except RuntimeError as e:
            self.broken = True
            _BROKEN.append(self.rank)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            wait = self.timeout_s if timeout_s is None else max(self.timeout_s, timeout_s)
            raise GroupError(f"expert parallelism: rank {self.rank} of {self.world_size}: {what} failed (another "
                              f"rank died or did not answer within {wait:g} s): {first}") from None

    def close(self) -> None:
        """Leave the group. A broken one is left as it is: tearing it down waits on (or aborts in) the
        transfers still pending to a rank that hangs; `exit_if_broken` ends such a process."""
        if self.shared is not None:
            self.shared.close()
            self.shared = None
        if dist.is_initialized() and not self.broken:
            dist.destroy_process_group()


_BROKEN: list[int] = []  # the ranks of this process's groups that broke


def exit_if_broken(code: int) -> None:
    """End the process now with `code` (its output flushed) if one of its groups broke; else return.
    Python's own exit would run gloo's destructors, which abort the process (SIGABRT, \"terminate
    called without an active exception\") while a send to a hung rank is pending, so the exit status
    would be -6 instead of the error's 1."""
    if _BROKEN:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


__all__ = ["DEFAULT_TIMEOUT_S", "STARTUP_TIMEOUT_S", "ExpertParallel", "GroupError", "NetCounters", "exit_if_broken"]
