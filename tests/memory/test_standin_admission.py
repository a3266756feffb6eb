"""benchmarks/standin_admission.py's replay of which misses a stand-in memory reads: reading only
over a colder expert reads fewer experts than reading every miss and hits at least as often on
skewed routing; free slots only reads at most one expert per slot; a larger margin never reads more."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.standin_admission import replay


def _skewed(seed: int, n_layers=3, n_tokens=400, n_experts=16, k=2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    weights = rng.dirichlet(np.full(n_experts, 0.3), size=n_layers)
    return np.stack([[rng.choice(n_experts, k, replace=False, p=w) for _ in range(n_tokens)] for w in weights])


@pytest.mark.parametrize("seed", range(3))
def test_admission_reads_less_and_hits_no_less(seed):
    trace = _skewed(seed)
    L, T, K = trace.shape
    always, m1, m2, free = (replay(trace, 16, 4, m) for m in (None, 1.0, 2.0, 0))
    assert m1["reads_per_token"] < always["reads_per_token"]
    assert m1["hit_rate"] >= always["hit_rate"]
    assert free["reads_per_token"] <= m2["reads_per_token"] <= m1["reads_per_token"]
    assert free["reads_per_token"] * T <= 4 * L  # one read per slot, then nothing
    # reading every miss: every use is a hit or a read
    assert always["reads_per_token"] * T == pytest.approx((1 - always["hit_rate"]) * T * L * K)
