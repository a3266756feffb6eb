"""Routing traces recorded from runs, Belady's optimal replay (checked against an exhaustive search
written here), the bytes-per-token comparison of `strata bench MODEL` and `--stats`, and the
policy's invariants under random traffic with uneven per-layer budgets."""
from functools import lru_cache

import numpy as np
import pytest

from strata.bench.cache import optimal_disk_bytes, replay_belady
from strata.errors import StrataError
from strata.memory.policy import LOADING, ExpertPolicy
from strata.memory.stats import MemoryStats


def _optimal_misses(seq: np.ndarray, slots: int, start: frozenset = frozenset()) -> int:
    """Fewest misses of any demand cache of `slots` entries on `seq` [T, K] (a step's K experts
    are all held while it runs), by exhaustive search over every choice of victims."""
    steps = [tuple(int(e) for e in row) for row in seq]

    @lru_cache(maxsize=None)
    def best(t: int, held: frozenset) -> int:
        if t == len(steps):
            return 0
        need = set(steps[t])
        misses = len(need - held)
        room = slots - len(need)
        keep_from = sorted(held - need)
        if len(keep_from) <= room:
            return misses + best(t + 1, frozenset(need | set(keep_from)))
        from itertools import combinations
        return misses + min(best(t + 1, frozenset(need | set(kept))) for kept in combinations(keep_from, room))

    return best(0, frozenset(start))


@pytest.mark.parametrize("seed", range(6))
def test_belady_matches_an_exhaustive_search(seed):
    rng = np.random.default_rng(seed)
    k, n_experts, slots = 2, 6, 3 + seed % 2
    seq = np.stack([rng.choice(n_experts, k, replace=False, p=[.3, .25, .15, .1, .1, .1]) for _ in range(14)])
    result = replay_belady(seq[None], slots, n_experts=n_experts)
    assert result.requests - result.hits.sum() == _optimal_misses(seq, slots)
    assert result.demand_loads == _optimal_misses(seq, slots)  # cold: every miss is a load


def test_belady_from_a_warm_start_with_per_layer_budgets():
    rng = np.random.default_rng(7)
    indices = np.stack([np.stack([rng.choice(5, 2, replace=False) for _ in range(12)]) for _ in range(2)])  # [2, 12, 2]
    initial = np.zeros((2, 5), dtype=bool)
    initial[0, [0, 1, 2]] = True
    initial[1, [3]] = True
    result = replay_belady(indices, [3, 2], initial=initial, n_experts=5)
    loads = result.extra["loads_per_layer"]
    assert loads[0] == _optimal_misses(indices[0], 3, frozenset({0, 1, 2}))
    assert loads[1] == _optimal_misses(indices[1], 2, frozenset({3}))
    tier = (np.array([3, 2]), initial, np.array([100, 1000]))
    assert optimal_disk_bytes(indices, tier) == 100 * loads[0] + 1000 * loads[1]
    with pytest.raises(StrataError, match="initial residency"):
        replay_belady(indices, [1, 2], initial=initial, n_experts=5)  # 3 resident in a 1-slot layer


def test_stats_record_the_trace_token_by_token():
    stats = MemoryStats([3, 5], n_experts=8)
    stats.record_routing(0, np.array([[1, 2]]))
    assert stats.trace() is None  # off until asked: it grows with every token
    stats.start_trace(origin="here")
    stats.record_routing(0, np.array([[1, 2], [3, 4]]))  # a 2-token step
    stats.record_routing(1, np.array([[5, 6], [7, 0]]))
    stats.record_routing_layers(np.array([0, 1]), np.array([[[2, 3]], [[4, 5]]]))  # one token, both layers
    trace = stats.trace()
    assert trace.dtype == np.int16 and trace.tolist() == [[[1, 2], [3, 4], [2, 3]], [[5, 6], [7, 0], [4, 5]]]
    assert stats.trace_origin == "here"
    stats.reset()
    assert stats.trace().shape == (2, 0, 0) and stats.trace_origin is None  # recording goes on, afresh
    stats.record_routing(0, np.array([[6, 7]]))
    assert stats.trace().shape == (2, 0, 2)  # layer 1 has not seen the token yet


@pytest.mark.parametrize("seed", range(3))
def test_policy_holds_budgets_and_never_evicts_pinned_or_loading(seed):
    rng = np.random.default_rng(seed)
    budgets = [2, 5, 3]
    policy = ExpertPolicy(3, 12, budgets, top_k=2)
    for _ in range(300):
        layer = int(rng.integers(3))
        step = rng.choice(12, 2, replace=False)
        policy.record(layer, step[None])
        held = {}
        for i in policy.hits_first(layer, step):  # the current step's experts: pinned as they come
            e = int(step[i])
            if policy.lookup(layer, e) is None:
                slot, evicted = policy.admit(layer, e)
                assert evicted not in held  # never a pinned expert of this step
                if rng.random() < 0.8:
                    policy.complete(layer, e)
            held[e] = policy.pin(layer, e)
        loading = [(s, int(policy.slot_expert[s])) for s in range(policy.n_slots) if policy.slot_state[s] == LOADING]
        for li in range(3):
            assert len(policy.resident(li)) <= budgets[li]
        for e, slot in held.items():
            assert policy.lookup(layer, e) == slot
            policy.unpin(layer, e)
        if rng.random() < 0.5 and policy.n_slots:  # a prefetch never displaces a load in flight
            other = int(rng.integers(3))
            free = [e for e in range(12) if policy.lookup(other, e) is None]
            admitted = policy.admit_prefetch(other, free[0], 1.0)
            if admitted is not None:
                policy.complete(other, free[0])
        for slot, e in loading:
            layer_of = int(np.searchsorted(policy.first_slot, slot, side="right") - 1)
            assert policy.lookup(layer_of, e) == slot
            policy.complete(layer_of, e)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from strata.synth.gguf_file import Shape, write

    path = tmp_path_factory.mktemp("optimal") / "tiny.gguf"
    write(path, Shape(n_layers=3, n_experts=16, top_k=2, hidden=256, ff=256, weight_scale=0.3, skew=0.1),
          drop_cache=False)
    return path


def test_cli_save_trace_and_stats_beside_belady(tiny_gguf, tmp_path, capsys):
    from strata.cli import main

    npz = tmp_path / "run.npz"
    assert main(["generate", str(tiny_gguf), "-p", "hello", "-n", "12", "--threads", "1", "--ignore-eos",
                 "--memory", "paged", "--host-mem", "2M", "--stats", "--save-trace", str(npz)]) == 0
    err = capsys.readouterr().err
    trace = np.load(npz)["indices"]
    assert trace.shape[0] == 3 and trace.shape[2] == 2 and trace.shape[1] >= 12 and trace.max() < 16
    assert (np.sort(trace, axis=-1)[..., 0] != np.sort(trace, axis=-1)[..., 1]).all()  # k distinct experts
    line = next(x for x in err.splitlines() if "Belady's optimal for the same routing" in x)
    ratio = float(line.rsplit("(", 1)[1].rstrip("x)"))
    assert ratio >= 1.0  # no demand cache reads less than the optimal one
    assert main(["generate", str(tiny_gguf), "-p", "hi", "-n", "2", "--memory", "direct",
                 "--save-trace", str(tmp_path / "x.npz")]) == 1
    assert "--save-trace" in capsys.readouterr().err


def test_bench_model_reports_belady_bytes_per_token(tiny_gguf):
    from strata.bench.model import bench_model

    r = bench_model(str(tiny_gguf), prompt=4, gen=8, reps=1, threads=1, memory="paged", host_mem=2 << 20)
    tiers = r["tg"][1]["tiers"]
    assert 0 < tiers["belady_disk_bytes_per_token"] <= tiers["disk_bytes_per_token"]


def test_record_preset_trace_keeps_the_presets_routing_shape(tmp_path):
    from strata.bench.traces import record_preset_trace
    from strata.memory.trace import load_trace

    path = record_preset_trace("qwen3-235b-like", 6, tmp_path / "q.npz", n_layers=2)
    indices = load_trace(path)  # checked: [L, T, K], k distinct experts per step
    assert indices.shape == (2, 6, 8) and indices.max() < 128
    assert len({tuple(sorted(step)) for step in indices[0]}) > 3  # routing differs from token to token
