"""`strata bench MODEL`: a whole model's prompt processing and decode speed, llama-bench style,
with where the time goes and what bounds it.

First an untimed warm-up, as llama-bench's (`warmup=False`: none): the whole prompt prefilled
once and one decode step of the largest batch, through the same paths as the timed runs, so the
memory has paged in the experts the prompt routes to and the pools and first calls are made
before anything is timed. Its figures (rates, expert reads) are reported apart, never averaged
with the timed runs. Then per batch size, `reps` repetitions of: prompt processing (one sequence of `prompt` random tokens,
tokens/s of its prefill) and generation (`batch` sequences of one random token each, `gen` tokens
each, no stop token: tokens/s over the decode steps, the prefill excluded). Decode runs also give
the expert memory's counters (hit rate per tier, bytes moved per token per tier, share of the time
spent waiting for experts; beside the disk's bytes per token, Belady's for the same routing: the
run's own trace replayed through the optimal policy at the host tier's slot budgets, from the
residency the run started with), the per-token time split, and the roofline:

- compute-bound rate: decode tokens/s with the waits for experts taken out, i.e. what the same run
  would do with every expert resident (measured: the forward passes' time less the waits);
- transfer-bound rate: per decode token, the expert bytes read from the disk over the disk's
  sequential O_DIRECT rate (measured on the same file) plus the bytes copied to the device over the
  host-to-device rate (measured here on CUDA; on the CPU the device tier is RAM and the copy is part
  of the compute);
- the bound is the lower of the two, and the measured rate is shown as a share of it.

Peak RSS and (on CUDA) peak device memory close the report. Must not print: it returns data and
`strata.commands.bench` formats it.
"""
from __future__ import annotations

import resource
import statistics
import time
from typing import Any, Callable, Sequence

import torch


def _spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "runs": values}


def _prompt(vocab: int, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def _h2d_rate(device: torch.device) -> float | None:
    """Bytes/s of a pinned host-to-device copy of 64 MiB (CUDA only)."""
    if device.type != "cuda":
        return None
    src = torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty_like(src, device=device)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(4):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(device)
    return 4 * src.numel() / (time.perf_counter() - t0)


def _disk_rate(path: str) -> float | None:
    """Bytes/s of a sequential O_DIRECT read of (up to 1 GiB of) the file; None where refused."""
    from strata.bench.pager import sequential_direct_rate

    try:
        return sequential_direct_rate(path, limit=1 << 30)[0]
    except OSError:
        return None


def _decode(model, batch: int, gen: int, seed: int) -> dict[str, Any]:
    """`batch` one-token prompts decoded together for `gen` tokens: tok/s of the decode steps and
    the memory's counters and the time split over the whole run (its prefill is `batch` tokens)."""
    from strata.bench.cache import disk_tier, optimal_disk_bytes

    prompts = [_prompt(model.transformer.vocab_size, 1, seed + i) for i in range(batch)]
    stats = model.memory_stats()
    tier = disk_tier(model.memory) if stats is not None else None
    if stats is not None:
        stats.reset()
        if tier is not None:
            stats.start_trace()  # the run's own routing, replayed below through Belady's policy
    model.reset_time_split()
    done = model.generate_batch(prompts, max_tokens=gen, temperature=0, stop_token_ids=())  # greedy: no sampler cost
    seconds = max(c.decode_seconds for c in done)
    tokens = sum(len(c.token_ids) - 1 for c in done)
    out = {"tok_s": tokens / seconds, "tokens": tokens, "seconds": seconds,
           "stats": stats.totals() if stats is not None else None, "split": model.time_split(),
           "prediction_depths": stats.prediction_score.to_dict() if stats is not None else {}}
    if tier is not None:
        out["belady_bytes_disk"] = optimal_disk_bytes(stats.trace(), tier)
    return out


def bench_load_kwargs(prompt: int, gen: int, batches: Sequence[int], load_kwargs: dict[str, Any]) -> dict[str, Any]:
    """`strata.load`'s arguments for a bench run (the followers of an expert-parallel one load the same)."""
    # prefill is measured as llama-bench measures it: every rep computes its whole prompt (the
    # prefix cache would serve the repeated prompt from the first rep's KV blocks)
    out = {"prefix_cache": False, "max_batch": max(batches), **load_kwargs}
    if out.get("n_ctx") is None:
        out["n_ctx"] = max(prompt, gen + 1) + 8
    return out


def bench_steps(reps: int, batches: Sequence[int], warmup: bool = True) -> int:
    """The progress steps of a `bench_model` run: the warm-up, then every repetition of every test."""
    return int(warmup) + reps * (1 + len(batches))


def _reads(model) -> int | None:
    """Experts the memory has read from the file so far (None: a memory that counts no reads)."""
    stats = model.memory_stats()
    return None if stats is None else int(stats.total("disk_reads"))


def _warm_up(model, tokens: list[int], batch: int, seed: int) -> dict[str, Any]:
    """llama-bench's warm-up: the whole prompt prefilled once and one decode step of `batch`
    sequences, untimed by the report: its rates and the expert reads it made, shown apart."""
    before = _reads(model)
    run = model.generate(tokens, max_tokens=1, temperature=0, stop_token_ids=())
    prefill_reads = None if before is None else _reads(model) - before
    tg = _decode(model, batch, 2, seed)  # resets the memory's counters: the prefill's are read above
    reads = None if prefill_reads is None else prefill_reads + int(tg["stats"]["disk_reads"])
    return {"pp_tok_s": len(tokens) / run.prefill_seconds, "tg_tok_s": tg["tok_s"], "batch": batch,
            "expert_reads": reads}


def bench_model(path: str, *, prompt: int = 512, gen: int = 128, batches: Sequence[int] = (1,), reps: int = 3,
                seed: int = 0, warmup: bool = True, on_step: Callable[[int, int, str], None] | None = None,
                **load_kwargs: Any) -> dict[str, Any]:
    """See the module docstring. `load_kwargs` go to `strata.load` (device, dtype, threads,
    memory, device_mem, host_mem, prefetch_depth, slot_form, compute); `warmup`: run the untimed
    warm-up first; `on_step(done, total, label)` after the warm-up and after each repetition of
    each test (progress)."""
    total = bench_steps(reps, batches, warmup)
    done = iter(range(1, total + 1))
    step = (lambda label: on_step(next(done), total, label)) if on_step else (lambda label: None)
    import strata

    if prompt < 1 or gen < 2 or reps < 1 or not batches or min(batches) < 1:
        raise ValueError(f"bench: prompt >= 1, gen >= 2, reps >= 1 and batch sizes >= 1, found prompt {prompt}, "
                         f"gen {gen}, reps {reps}, batches {list(batches)}")
    t0 = time.perf_counter()
    model = strata.load(path, **bench_load_kwargs(prompt, gen, batches, load_kwargs))
    ep = load_kwargs.get("expert_parallel")
    if ep is not None:  # rank 0 leads: the other ranks run `strata.distributed.lockstep.follow`
        from strata.distributed.lockstep import lead

        lead(model, ep)
    load_s = time.perf_counter() - t0
    try:
        tokens = _prompt(model.transformer.vocab_size, prompt, seed)
        greedy = dict(temperature=0, stop_token_ids=())  # no sampler cost, and every run the same tokens
        warm = _warm_up(model, tokens, max(batches), seed + 1000 * reps) if warmup else None  # not a timed prompt
        if warm is not None:
            step("warm-up")
        pp, pp_reads, cached = [], [], 0
        for _ in range(reps):
            before = _reads(model)
            run = model.generate(tokens, max_tokens=1, **greedy)
            pp.append(prompt / run.prefill_seconds)
            pp_reads.append(None if before is None else _reads(model) - before)
            cached += run.cached_tokens
            step(f"pp{prompt}")
        result: dict[str, Any] = {
            "file": str(path), "prompt": prompt, "gen": gen, "reps": reps, "load_s": load_s,
            "memory": repr(model.memory), "memory_kind": model.plan.memory, "memory_why": model.plan.memory_why,
            "compute": "packed" if model.transformer.compute is not None else "float",
            "device": str(model.device), "threads": load_kwargs.get("threads"), "warmup": warm,
            "pp_tok_s": _spread(pp), "pp_expert_reads": pp_reads, "pp_cached_tokens": cached,
            "tg": {}}
        disk, h2d = _disk_rate(str(path)), _h2d_rate(model.device)
        result.update(disk_gbs=disk and disk / 1e9, h2d_gbs=h2d and h2d / 1e9)
        for b in batches:
            runs = []
            for r in range(reps):
                runs.append(_decode(model, b, gen, seed + 1000 * r))
                step(f"tg{gen} x{b}")
            result["tg"][b] = _summary(runs, disk, h2d)
        result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if model.device.type == "cuda":
            result["peak_device_bytes"] = torch.cuda.max_memory_allocated(model.device)
        return result
    finally:
        model.close()


def _summary(runs: list[dict[str, Any]], disk: float | None, h2d: float | None) -> dict[str, Any]:
    """One batch size's decode runs: speed, memory figures of the last run, the roofline."""
    last = runs[-1]
    split, stats, n = last["split"], last["stats"], last["tokens"]
    out: dict[str, Any] = {"tok_s": _spread([r["tok_s"] for r in runs]), "split_ms": {
        k: 1e3 * split[k] for k in ("attention", "expert_compute", "expert_wait", "dequantization", "other")}}
    per_token = split["attention"] + split["expert_compute"] + split["expert_wait"] + split["dequantization"] \
        + split["other"]  # seconds per processed token
    wait = split["expert_wait"]
    out["wait_share"] = wait / per_token if per_token > 0 else 0.0
    # per processed token; the run's tokens are its decode tokens plus one prompt token per sequence
    compute_tok_s = 1.0 / (per_token - wait) if per_token > wait else None
    roof: dict[str, Any] = {"compute_bound_tok_s": compute_tok_s}
    if stats is not None:
        processed = max(split["tokens"], 1)
        disk_b = (stats["bytes_disk"]) / processed
        dev_b = stats["bytes_to_device"] / processed
        host_total = stats["host_hits"] + stats["disk_reads"]
        belady = last.get("belady_bytes_disk")
        out["tiers"] = {"device_hit_rate": stats["device_hit_rate"],
                        "host_hit_rate": stats["host_hits"] / host_total if host_total else None,
                        "disk_bytes_per_token": disk_b, "device_bytes_per_token": dev_b,
                        "belady_disk_bytes_per_token": None if belady is None else belady / processed,
                        "disk_reads": stats["disk_reads"], "prefetch_used": stats["prefetch_used"],
                        "prefetch_unpaid": stats["prefetch_unpaid"], "prediction_depths": last["prediction_depths"]}
        transfer_s = (disk_b / disk if disk and disk_b else 0.0) + (dev_b / h2d if h2d and dev_b else 0.0)
        roof["transfer_bound_tok_s"] = 1.0 / transfer_s if transfer_s > 0 else None
    bounds = [v for v in roof.values() if v]
    roof["bound_tok_s"] = min(bounds) if bounds else None
    roof["share_of_bound"] = out["tok_s"]["mean"] / roof["bound_tok_s"] if roof["bound_tok_s"] else None
    out["roofline"] = roof
    out["tokens_per_run"] = n
    return out


__all__ = ["bench_model"]
