"""One rank of an expert-parallel test run: `python -m tests.distributed.worker MODEL OUT.json
MEMORY COMPUTE MODE` with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set. Writes the greedy path,
a batch of two prompts and the logits of a prompt (MODE "run"; "chunked": the same with
prompts prefilled in chunks of CHUNK tokens), or dies/hangs mid-run as rank 1
(MODE "die", "hang"), or loads another file as rank 1 (MODE "mismatch": MODEL is "A,B")."""
from __future__ import annotations

import json
import os
import sys
import time

import torch

import strata
from strata.errors import StrataError
from strata.distributed import ExpertParallel
from strata.distributed.group import exit_if_broken

PROMPT = [5, 17, 42, 9, 33, 71, 8, 12]
OTHER = [3, 44, 19, 27, 60]
CHUNK = 3  # tokens per engine step in MODE "chunked": PROMPT prefills in 3 chunks


def memory_options(memory: str) -> dict:
    """MEMORY as `strata.load`'s keywords: a kind, or "KIND:option=value,..." ("tiered:prefetch_depth=1")."""
    kind, _, rest = memory.partition(":")
    options = dict(item.split("=") for item in rest.split(",") if item)
    return {"memory": kind, **{k: int(v) if v.isdigit() else v for k, v in options.items()}}


def load(path: str, memory: str, compute: str, ep: ExpertParallel | None, chunked: bool = False):
    step = {"max_step_tokens": CHUNK} if chunked else {}
    return strata.load(path, threads=1, n_ctx=128, max_batch=2, compute=compute, expert_parallel=ep,
                       **memory_options(memory), **step)


def record_loads() -> dict:
    """Every (layer, expert) the host tier reads from the file ("loads") and the tiered memory is
    asked to prefetch ("prefetches") in this process, in order (MODE "loads")."""
    from strata.memory.host import HostTier
    from strata.memory.tiered.memory import TieredExpertMemory

    seen: dict = {"loads": [], "prefetches": []}
    start, prefetch = HostTier._start, TieredExpertMemory.prefetch

    def recording_start(self, layer, expert, *args, **kwargs):
        seen["loads"].append((layer, expert))
        return start(self, layer, expert, *args, **kwargs)

    def recording_prefetch(self, layer, expert_ids, *args, **kwargs):
        seen["prefetches"].extend((layer, e) for e in expert_ids)
        return prefetch(self, layer, expert_ids, *args, **kwargs)

    HostTier._start, TieredExpertMemory.prefetch = recording_start, recording_prefetch
    return seen


def from_flags(path: str, memory: str, compute: str) -> tuple:
    """MODE "flags": this rank's group and model as `strata generate` makes them from its command
    line, MEMORY being its memory flags ("--memory paged --host-mem 8M --rank-memory 1:host-mem=600K")."""
    from strata.cli import build_parser
    from strata.commands.common import expert_parallel, load_kwargs

    args = build_parser().parse_args(["generate", path, "-p", "x", "--threads", "1", "--ctx", "128",
                                      "--compute", compute, "--expert-parallel", *memory.split()])
    ep = expert_parallel(args)
    return ep, strata.load(path, max_batch=2, expert_parallel=ep, **load_kwargs(args))


def results(model) -> dict:
    """Greedy path, a batch of two, and the prompt's logits (the same calls as one process makes);
    the decode runner of the plan, and a greedy decode's log-probabilities through it and through
    the per-call path (every rank swaps its runner at the same point)."""
    from strata.runtime import FLOAT, PACKED

    greedy = model.generate(PROMPT, temperature=0, max_tokens=10, stop_token_ids=()).token_ids
    batch = [c.token_ids for c in model.generate_batch([PROMPT, OTHER], temperature=0, max_tokens=6, stop_token_ids=())]
    decode = [_decode_logprobs(model)]
    runner = model.engine.model
    model.engine.model = runner.with_decode(FLOAT if runner.plan.decode == FLOAT else PACKED)
    try:
        decode.append(_decode_logprobs(model))
    finally:
        model.engine.model = runner
    return {"greedy": greedy, "batch": batch, "logits": model.logits(PROMPT).tolist(), "plan": model.plan.decode,
            "decode_logprobs": decode}


def _decode_logprobs(model) -> list[float]:
    done = model.generate(OTHER, temperature=0, max_tokens=6, logprobs=1, stop_token_ids=())
    return [lp.logprob for lp in done.logprobs]


def main() -> int:
    path, out, memory, compute, mode = sys.argv[1:6]
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    late = float(os.environ.get("STRATA_TEST_LATE_S", "0")) if rank == 1 else 0.0  # a slow rank's start
    time.sleep(late)
    ep = ExpertParallel.from_env(timeout_s=float(os.environ.get("STRATA_EP_TIMEOUT", "20")))
    time.sleep(late)
    if mode == "mismatch":
        path = path.split(",")[min(rank, 1)]
    loads = record_loads() if mode == "loads" else None
    try:
        if mode == "flags":
            ep, model = from_flags(path, memory, compute)
        else:
            model = load(path, memory, compute, ep, chunked=mode == "chunked")
        with model:
            if mode in ("die", "hang") and rank == 1:
                model.generate(PROMPT, temperature=0, max_tokens=2, stop_token_ids=())
                if mode == "die":
                    os._exit(3)
                time.sleep(3600)
            data = results(model)
            data["net"], data["tokens"] = ep.counters(), model.time_split()["tokens"]
            if mode == "flags":
                data["host_budget"] = model.memory.host.budget
            if loads is not None:
                plan = ep.plan(model.model_file)
                owned = [[layer, e] for layer, owners in zip(plan.layers, plan.owners)
                         for e, ranks in enumerate(owners) if rank in ranks]
                data.update(loads, owned=owned, issued=int(model.memory_stats().totals()["prefetch_issued"]))
    except StrataError as e:
        print(f"error: {e}", file=sys.stderr)
        ep.close()
        exit_if_broken(1)  # as `strata` ends a rank whose group broke
        return 1
    ep.close()
    with open(out.format(rank), "w") as f:
        json.dump(data, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
