"""The cache candidates of `strata bench cache --candidates`: per-layer budgets solved from routing
counts (held, summing to the total, better than any other split for the hot sets), each
candidate's replay invariants (budgets held, the step's experts never evicted, never fewer loads
than Belady), its online causality, and the window bound meeting Belady at full sight."""
from itertools import product

import numpy as np
import pytest

from strata.bench.cache import replay_belady
from strata.bench.cache_candidates import (CANDIDATES, allocate_budgets, bench_candidates, cooccurrence_probs,
                                           replay_candidate)
from strata.bench.traces import find_trace
from strata.errors import StrataError

FLAME = "flame_moe_290m_layers2-9_2048tok.npz"


def _trace(seed: int, n_layers=3, n_tokens=80, n_experts=12, k=2) -> np.ndarray:
    """Skewed routing with cross-layer structure: layer L+1 tends to pick (expert of L + 1) mod E."""
    rng = np.random.default_rng(seed)
    weights = rng.dirichlet(np.full(n_experts, 0.4), size=n_layers)  # [L, E]
    out = np.zeros((n_layers, n_tokens, k), dtype=np.int64)
    for t in range(n_tokens):
        for layer in range(n_layers):
            p = weights[layer].copy()
            if layer:
                p[(out[layer - 1, t] + 1) % n_experts] += 1.0
            out[layer, t] = rng.choice(n_experts, k, replace=False, p=p / p.sum())
    return out


def _hot_hits(counts: np.ndarray, budgets) -> float:
    return sum(np.sort(row)[::-1][:b].sum() / row.sum() for row, b in zip(counts, budgets))


@pytest.mark.parametrize("seed", range(4))
def test_allocated_budgets_sum_to_the_total_within_bounds_and_are_best(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 50, (3, 6)) * (rng.random((3, 6)) < 0.7)
    counts[:, 0] += 1
    for total in (6, 9, 12):
        budgets = allocate_budgets(counts, total, floor=2, cap=5)
        assert budgets.sum() == total and budgets.min() >= 2 and budgets.max() <= 5
        best = max(_hot_hits(counts, b) for b in product(range(2, 6), repeat=3) if sum(b) == total)
        assert _hot_hits(counts, budgets) == pytest.approx(best)  # exhaustive search agrees


def test_skewed_layers_get_fewer_slots():
    counts = np.array([[100, 1, 1, 1, 1, 1, 1, 1], [10, 10, 10, 10, 10, 10, 10, 10]])
    budgets = allocate_budgets(counts, 8, floor=2)
    assert budgets.tolist() == [2, 6]
    with pytest.raises(StrataError, match="cannot give each"):
        allocate_budgets(counts, 3, floor=2)


@pytest.mark.parametrize("kind", CANDIDATES + ("window-4",))
def test_candidates_hold_budgets_keep_the_step_and_never_beat_belady_loads(kind):
    indices = _trace(1)
    budgets = [3, 5, 4]

    def check(layer, t, resident):
        assert resident.sum() <= budgets[layer]
        assert resident[indices[layer, t]].all()  # the step's experts are all held after it

    r = replay_candidate(indices, budgets, kind, on_step=check)
    belady = replay_belady(indices, budgets)
    assert r["loads_per_request"] >= belady.demand_loads / indices.size
    if not kind.endswith("+prefetch"):
        assert r["hit_rate"] <= belady.hit_rate  # only prefetch can pass Belady's hit rate


def test_window_of_the_whole_trace_is_belady():
    indices = _trace(2)
    r = replay_candidate(indices, 4, f"window-{indices.shape[1]}")
    belady = replay_belady(indices, 4)
    assert r["hit_rate"] == belady.hit_rate
    assert r["loads_per_request"] == belady.demand_loads / indices.size


def test_predictions_and_replays_use_only_the_past():
    indices = _trace(3)
    changed = indices.copy()
    changed[:, 60:] = _trace(4)[:, 60:]
    q, q2 = cooccurrence_probs(indices), cooccurrence_probs(changed)
    assert np.array_equal(q[:, :60], q2[:, :60], equal_nan=True)
    assert np.isnan(q[0]).all() and not np.isnan(q[1:]).any()  # defined past layer 0
    for kind in ("reuse", "predicted+prefetch"):
        seen = [[], []]
        for run, trace in enumerate((indices, changed)):
            replay_candidate(trace, 4, kind, on_step=lambda layer, t, res, run=run: seen[run].append(
                (layer, t, res.copy())) if t < 60 else None)
        assert all(np.array_equal(a[2], b[2]) for a, b in zip(*seen))


def test_unknown_candidate_is_refused():
    with pytest.raises(StrataError, match="cache candidate 'arc'"):
        replay_candidate(_trace(0), 4, "arc")


@pytest.mark.slow
@pytest.mark.skipif(find_trace(FLAME) is None, reason="shared/traces not beside the checkout")
def test_real_trace_targets_where_they_hold():
    """On the real trace at 1/8 of the experts, gated prefetch passes 90% of Belady's hit rate with
    loads within 1.3x Belady's; no online demand candidate reaches 90% (the trace's reuse is near
    chance, see benchmarks/RESULTS.md), and each reads at least Belady's loads."""
    result = bench_candidates(find_trace(FLAME), [8])["slots"]["8"]
    assert result["predicted+prefetch"]["hit_over_belady"] >= 0.9
    assert result["predicted+prefetch"]["loads_over_belady"] <= 1.3
    for kind in ("lfu", "lrfu", "reuse", "predicted", "budgets"):
        assert 0.5 <= result[kind]["hit_over_belady"] < 0.9 and result[kind]["loads_over_belady"] >= 1.0


def test_cli_prints_each_candidate_against_belady(tmp_path, capsys):
    from strata.cli import main

    np.savez(tmp_path / "t.npz", indices=_trace(0, n_tokens=30))
    assert main(["bench", "cache", "--candidates", "--trace", str(tmp_path / "t.npz"), "--slots", "3"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[-2:] for line in out.splitlines() if line.startswith("  ")}
    assert set(CANDIDATES) <= set(rows) and "window-256" in rows
    assert rows["window-256"] == ["1.00", "1.00x"]  # sees the whole trace: Belady itself
