"""The trace replay (`strata bench cache`) and decoding make the same placement decisions: the same
routing fed through `TieredExpertMemory` (router look-ahead announcements via `prefetch`, then
`observe`, `acquire`, `release`) and through `replay_policy` leaves the same page table after
every step, with the same hits, misses and prefetches. Both drive the same `ExpertPolicy`,
`Cooccurrence` predictor and `ExpertPolicy.announce`."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from strata.gguf import open_model
from strata.memory.budget import (DEFAULT_PREFETCH_MARGIN, REPLAY_PREFETCH_MARGIN, TieredConfig,
                                  device_budget_for_slots, host_budget_for_slots)
from strata.memory.device import expert_geometry
from strata.memory.policy import PolicyConfig
from strata.memory.tiered import TieredExpertMemory
from strata.memory.trace import ReplayConfig, replay_policy

from .tiered_fixture import N_EXPERTS, N_LAYERS, TOP_K, moe_file

SLOTS = 4


def _routing(n_tokens: int, seed: int = 0) -> np.ndarray:
    """[L, T, K] routing with hot experts and a cross-layer mapping (so co-occurrence predicts
    something), each step's experts distinct and ascending (the order the model acquires in)."""
    rng = np.random.default_rng(seed)
    hot = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05])
    maps = [rng.permutation(N_EXPERTS) for _ in range(N_LAYERS)]
    out = np.zeros((N_LAYERS, n_tokens, TOP_K), dtype=np.int64)
    for t in range(n_tokens):
        base = rng.choice(N_EXPERTS, size=TOP_K, replace=False, p=hot)
        for li in range(N_LAYERS):
            ids = maps[li][base] if rng.random() < 0.8 else rng.choice(N_EXPERTS, size=TOP_K, replace=False)
            out[li, t] = np.sort(ids)
    return out


def _decode(path, routing: np.ndarray, lookahead: bool, margin: float) -> tuple[list[np.ndarray], np.ndarray, dict]:
    """Feed `routing` through a TieredExpertMemory in decoding's order; the device page table after
    every step, hits [L, T] (device hits, loads in flight included) and counters."""
    n_layers, n_tokens, _ = routing.shape
    with open_model(path) as mf:
        layers = mf.expert_layers
        config = TieredConfig(
            device_mem=device_budget_for_slots(expert_geometry(mf), "packed", torch.float32, "cpu", n_layers, SLOTS,
                                               TOP_K),
            host_mem=host_budget_for_slots(mf, N_EXPERTS),  # the host tier never refuses a prefetch
            slot_form="packed", prefetch_depth=1, cooccurrence_min_prob=0.0, cooccurrence_min_tokens=0,
            prefetch_read_cost=0.0,
            prefetch_margin=margin)
        mem = TieredExpertMemory(mf, config=config, n_threads=1)
        tables, hits = [], np.zeros((n_layers, n_tokens), dtype=np.int64)
        try:
            assert mem.plan.slots_per_layer == SLOTS
            stats = mem.stats
            for t in range(n_tokens):
                for li, layer in enumerate(layers):
                    if lookahead and li == 0:  # the embeddings announce the first layer
                        mem.prefetch(layers[0], routing[0, t].tolist())
                    if lookahead and li + 1 < n_layers:  # block li announces the next MoE layer
                        mem.prefetch(layers[li + 1], routing[li + 1, t].tolist())
                    ids = routing[li, t].tolist()
                    mem.observe(layer, torch.tensor([ids]))
                    before = stats.device_hits[li] + stats.device_late[li]
                    mem.acquire(layer, ids)
                    mem.release(layer, ids)
                    hits[li, t] = stats.device_hits[li] + stats.device_late[li] - before
                    for ready in mem.loads.ready:  # every queued prefetch done: placement no longer timing-dependent
                        ready.wait()
                    tables.append(mem.policy.page_table.copy())
            totals = {"misses": stats.total("device_misses"), "prefetches": stats.total("prefetch_issued"),
                      "cancelled": stats.total("prefetch_cancelled")}
        finally:
            mem.close()
    return tables, hits, totals


@pytest.mark.parametrize("margin", [DEFAULT_PREFETCH_MARGIN, REPLAY_PREFETCH_MARGIN], ids=lambda m: f"margin{m:g}")
@pytest.mark.parametrize("lookahead", [False, True], ids=["cooccurrence", "lookahead+cooccurrence"])
def test_replay_and_decode_make_the_same_placement_decisions(lookahead, margin):
    routing = _routing(120)
    tables, hits, totals = _decode(moe_file(), routing, lookahead, margin)
    replayed = []
    run = replay_policy(routing, SLOTS, ReplayConfig(prefetch_depth=1, lookahead=lookahead,
                                                     policy=PolicyConfig(prefetch_margin=margin)),
                        n_experts=N_EXPERTS, on_step=lambda t, layer, policy: replayed.append(policy.page_table.copy()))
    assert totals["cancelled"] == 0
    assert len(replayed) == len(tables) == N_LAYERS * routing.shape[1]
    for i, (ours, theirs) in enumerate(zip(tables, replayed)):
        assert np.array_equal(ours, theirs), f"token {i // N_LAYERS}, expert layer {i % N_LAYERS}"
    assert np.array_equal(hits, run.hits.sum(axis=-1))
    assert totals["misses"] == run.demand_loads and totals["prefetches"] == run.prefetch_loads
    # prefetches happened, and more loads than slots: evictions too
    assert run.prefetch_loads > 0 and run.prefetch_loads + run.demand_loads > 2 * N_LAYERS * SLOTS
