"""`strata bench tiered`: decoding through the tiered expert memory, prefetch depths side by side.

Each run loads the model with the given budgets and one prefetch depth, decodes `tokens` tokens
from the same random prompt (sampled at the given temperature from the whole distribution, top_k 0,
with a fixed seed, so the text varies but every run decodes the same tokens: prefetch must not
change them), and reports the expert memory's counters for
the decode steps only (reset after the first token, so the prompt's prefill does not count):
hit rates per tier, bytes moved, the time compute waited for experts, prefetch precision and
recall, and tokens per second. The compute is float (on the CPU too: there packed compute runs on
the paged memory, which has no prefetch to compare). Runs alternate between depths `repeat` times; the headline is the
ratio of the median wait with prefetch to the median wait without (depth 0 must be among the
depths for it).

Must not print or assert: it returns data and `strata.commands.bench` prints it.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch

KEYS = ("device_hit_rate", "device_hits", "device_late", "device_misses", "host_hits", "disk_reads",
        "prefetch_issued", "prefetch_used", "prefetch_refused", "prefetch_cancelled", "prefetch_disk_reads",
        "bytes_disk", "bytes_to_device", "wait_s", "dequant_s", "precision", "recall", "requests")


def decode_run(path: str, depth: int, prompt: list[int], tokens: int, *, temperature: float, seed: int,
               **load_kwargs: Any) -> dict[str, Any]:
    """One load and decode; the memory's counters over the decode steps."""
    import strata

    # float compute unless asked: on the CPU packed compute is served by the paged memory (no prefetch)
    with strata.load(path, prefetch_depth=depth, **{"compute": "float", **load_kwargs}) as model:
        stream = model.generate(prompt, max_tokens=tokens, temperature=temperature, top_k=0, seed=seed, stream=True,
                                stop_token_ids=())
        t0, n = None, 0
        for _ in stream:
            n += 1
            if t0 is None:  # the prefill is over: count decode steps only
                model.memory_stats().reset()
                t0 = time.perf_counter()
        seconds = time.perf_counter() - t0
        totals = model.memory_stats().totals()
        plan = model.memory.plan
        return {"depth": depth, "device": str(model.device), "token_ids": stream.completion.token_ids,
                "decode_tok_s": (n - 1) / seconds,
                "form": plan.form, "device_slots_per_layer": plan.slots_per_layer,
                "host_slots_per_layer": model.memory.host.slots_per_layer,
                **{k: totals[k] for k in KEYS}}


def bench_tiered(path: str, *, depths: Sequence[int] = (0, 2), tokens: int = 64, prompt_len: int = 8,
                 repeat: int = 1, temperature: float = 1.0, seed: int = 0,
                 on_run: Callable[[int, int, str], None] | None = None, **load_kwargs: Any) -> dict[str, Any]:
    """Decode with each prefetch depth, alternating, `repeat` times; see the module docstring.
    `load_kwargs` go to `strata.load` (device, dtype, threads, device_mem, host_mem, slot_form);
    `on_run(done, total, label)` after each run (progress)."""
    from strata.gguf import open_model

    with open_model(path) as mf:
        vocab = mf.hparams.vocab_size
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (prompt_len,), generator=g).tolist()
    runs: dict[int, list[dict[str, Any]]] = {d: [] for d in depths}
    for _ in range(repeat):
        for d in depths:
            runs[d].append(decode_run(path, d, prompt, tokens, temperature=temperature, seed=seed, **load_kwargs))
            if on_run is not None:
                on_run(sum(map(len, runs.values())), repeat * len(depths), f"depth {d}")
    reference = runs[depths[0]][0]["token_ids"]
    same = all(r["token_ids"] == reference for rs in runs.values() for r in rs)
    result: dict[str, Any] = {"file": str(path), "device": runs[depths[0]][0]["device"], "tokens": tokens,
                              "repeat": repeat, "same_tokens": same,
                              "form": runs[depths[0]][0]["form"], "by_depth": {}}
    for d, rs in runs.items():
        row = {k: statistics.median(r[k] for r in rs if r[k] is not None) if any(r[k] is not None for r in rs)
               else None for k in (*KEYS, "decode_tok_s")}
        row.update(device_slots_per_layer=rs[0]["device_slots_per_layer"],
                   host_slots_per_layer=rs[0]["host_slots_per_layer"], runs_wait_s=[r["wait_s"] for r in rs])
        result["by_depth"][d] = row
    if 0 in runs:
        base = result["by_depth"][0]["wait_s"]
        result["wait_ratio"] = {d: (row["wait_s"] / base if base else None)
                                for d, row in result["by_depth"].items() if d != 0}
    return result


__all__ = ["bench_tiered", "decode_run"]
