"""Expert placement policy, co-occurrence predictor and trace replay: unit tests on small pools,
and the acceptance figures on the real FLAME-MoE routing trace (skipped where it is absent)."""
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from strata.errors import StrataError, StrataFormatError
from strata.memory.policy import FREE, LOADING, READY, ExpertPolicy, PolicyConfig, PoolExhaustedError
from strata.bench.cache import replay_belady, replay_fixed, replay_lru
from strata.bench.traces import find_trace
from strata.memory.predict import CooccurrencePredictor
from strata.memory.trace import ReplayConfig, load_trace, predictor_recall, replay_policy

ROOT = Path(__file__).resolve().parents[2]
TRACE_NAME = "flame_moe_290m_layers2-9_2048tok.npz"

# The trace README's table: slots per layer -> (LRU, Belady, best fixed hot set), 3 decimals.
README_TABLE = {8: (0.136, 0.251, 0.167), 16: (0.261, 0.521, 0.314), 32: (0.526, 0.787, 0.580)}


def _trace_path() -> Path | None:
    return find_trace(TRACE_NAME)


@pytest.fixture(scope="module")
def trace() -> np.ndarray:  # [L, T, K]
    path = _trace_path()
    if path is None:
        pytest.skip(f"routing trace {TRACE_NAME} not found: set STRATA_TRACE (its file or folder) or place it in "
                    f"{ROOT.parent / 'shared' / 'traces'}")
    return load_trace(path)


@pytest.fixture(scope="module")
def policy_runs(trace) -> dict:
    return {n: replay_policy(trace, n) for n in (16, 32)}


def _policy(budgets, n_layers=1, n_experts=8, top_k=2, **config) -> ExpertPolicy:
    return ExpertPolicy(n_layers, n_experts, budgets, top_k=top_k, config=PolicyConfig(**config))


def _load(policy: ExpertPolicy, layer: int, expert: int) -> tuple[int, int | None]:
    slot, evicted = policy.admit(layer, expert)
    policy.complete(layer, expert)
    return slot, evicted


def _check_consistent(policy: ExpertPolicy) -> None:
    """The page table, the slot arrays and lookups describe the same placement."""
    for layer in range(policy.n_layers):
        lo, hi = policy.first_slot[layer], policy.first_slot[layer + 1]
        for expert in range(policy.n_experts):
            slot = policy.lookup(layer, expert)
            assert slot == (None if policy.page_table[layer, expert] < 0 else policy.page_table[layer, expert])
            if slot is not None:
                assert lo <= slot < hi and policy.slot_expert[slot] == expert
                assert policy.slot_state[slot] in (LOADING, READY)
        for slot in range(lo, hi):
            expert = policy.slot_expert[slot]
            assert (expert < 0) == (policy.slot_state[slot] == FREE)
            if expert >= 0:
                assert policy.page_table[layer, expert] == slot
            else:
                assert policy.slot_pins[slot] == 0
        assert (policy.page_table[layer] >= 0).sum() == (policy.slot_state[lo:hi] != FREE).sum()


# ---- slot life cycle ---------------------------------------------------------------------------

def test_pinned_slots_are_never_evicted():
    policy = _policy(3)
    for e in (0, 1, 2):
        _load(policy, 0, e)
    pinned_slot = policy.pin(0, 1)
    policy.record(0, np.array([0, 2]))  # make 1 the coldest expert: the first victim were it free
    for e in range(3, 8):
        _, evicted = _load(policy, 0, e)
        assert evicted != 1
        policy.record(0, np.array([e, (e + 1) % 8]))
    assert policy.lookup(0, 1) == pinned_slot
    policy.unpin(0, 1)
    _, evicted = _load(policy, 0, 0)
    assert evicted == 1  # unpinned and coldest: now it goes


def test_loads_in_flight_are_never_evicted():
    policy = _policy(3)
    slot, _ = policy.admit(0, 5)  # in flight: never completed yet
    for e in range(5):
        _load(policy, 0, e)
        assert policy.lookup(0, 5) == slot and policy.slot_state[slot] == LOADING
    assert policy.complete(0, 5) == slot and policy.is_ready(slot)


def test_exhausted_pool_raises_a_clear_error():
    policy = _policy(2, top_k=1)
    _load(policy, 0, 0)
    policy.pin(0, 0)
    policy.admit(0, 1)  # loading
    with pytest.raises(PoolExhaustedError, match=r"layer 0 .* expert 2 .* all 2 of its slots .*1 pinned, 1 loading"):
        policy.admit(0, 2)
    assert policy.admit_prefetch(0, 2, 1.0) is None  # a prefetch is refused, not an error
    policy.unpin(0, 0)
    _, evicted = policy.admit(0, 2)
    assert evicted == 0


def test_cancelled_load_frees_its_slot():
    policy = _policy(2)
    slot, _ = policy.admit(0, 3)
    policy.cancel(0, 3)
    assert policy.lookup(0, 3) is None and policy.slot_state[slot] == FREE
    _check_consistent(policy)


def test_misuse_is_refused_with_names():
    policy = _policy(2)
    _load(policy, 0, 1)
    with pytest.raises(StrataError, match="expert 1 of layer 0 is already in slot"):
        policy.admit(0, 1)
    with pytest.raises(StrataError, match="unpin: expert 1 of layer 0 is not pinned"):
        policy.unpin(0, 1)
    with pytest.raises(StrataError, match="complete: expert 1 of layer 0 should be loading, found ready"):
        policy.complete(0, 1)
    with pytest.raises(StrataError, match="pin: expert 4 of layer 0 is not resident"):
        policy.pin(0, 4)
    with pytest.raises(StrataError, match="layer 3 out of range"):
        policy.lookup(3, 0)
    with pytest.raises(StrataError, match="expert ids out of range 0..7: found 0..9"):
        policy.record(0, np.array([0, 9]))


@pytest.mark.parametrize("budgets, match", [
    (1, "between 2 .* and 8 .*, found 1"),
    (9, "between 2 .* and 8 .*, found 9"),
    ([2, 2, 2], "expected one int or 2, found"),
])
def test_bad_budgets_are_refused(budgets, match):
    with pytest.raises(StrataError, match=match):
        ExpertPolicy(2, 8, budgets, top_k=2)


def test_per_layer_budgets_partition_one_pool():
    policy = _policy([2, 5], n_layers=2)
    assert policy.n_slots == 7 and list(policy.first_slot) == [0, 2, 7]
    for e in range(5):
        _load(policy, 1, e)
    _load(policy, 0, 0)
    assert set(policy.page_table[1][policy.page_table[1] >= 0]) == {2, 3, 4, 5, 6}
    assert policy.page_table[0, 0] in (0, 1)
    _check_consistent(policy)


# ---- scoring -----------------------------------------------------------------------------------

def test_decay_moves_the_hot_set_when_traffic_shifts():
    policy = _policy(4, half_life_steps=16)
    rng = np.random.default_rng(0)
    for phase, hot in enumerate(([0, 1, 2, 3], [4, 5, 6, 7])):
        for _ in range(120):
            step = rng.choice(hot, size=2, replace=False)
            policy.record(0, step)
            for e in step:
                if policy.lookup(0, e) is None:
                    _load(policy, 0, e)
        assert set(policy.resident(0)) == set(hot), f"phase {phase}"
        assert set(np.argsort(-policy.use_rate(0))[:4]) == set(hot)


def test_without_decay_the_old_hot_set_would_win():
    # The same shift with a half-life far longer than the trace: counts alone keep ranking the old
    # experts first after a short second phase, which is why the policy decays them.
    policy = _policy(4, half_life_steps=1e9)
    for hot, steps in (([0, 1], 200), ([4, 5], 50)):
        for _ in range(steps):
            policy.record(0, np.array(hot))
    assert set(np.argsort(-policy.use_rate(0))[:2]) == {0, 1}


def test_hinted_experts_are_protected():
    policy = _policy(3)
    for e in (0, 1, 2):
        _load(policy, 0, e)
    policy.record(0, np.array([0, 1]))
    policy.record(0, np.array([1, 2]))  # rates: 1 > 0 = 2 (0 is older, so decayed further)
    policy.hint(0, np.array([0]), 0.9)
    _, evicted = _load(policy, 0, 3)
    assert evicted == 2  # 0 is colder but predicted
    policy.record(0, np.array([3, 1]))  # the hinted step came: hints are resolved
    _, evicted = _load(policy, 0, 4)
    assert evicted == 0


def test_prefetch_displaces_only_colder_experts():
    policy = _policy(2, prefetch_margin=2.0)
    for e in (0, 1):
        _load(policy, 0, e)
    for _ in range(50):
        policy.record(0, np.array([0, 1]))  # both used every step: keep values near 1
    assert policy.admit_prefetch(0, 5, 0.9) is None
    for _ in range(400):
        policy.record(0, np.array([2, 3]))  # 0 and 1 cool down
    slot, evicted = policy.admit_prefetch(0, 5, 0.9)
    assert evicted in (0, 1) and policy.slot_state[slot] == LOADING


def test_admit_over_takes_a_free_slot_or_a_colder_victim_only():
    policy = _policy(2)
    assert policy.admit_over(0, 4, 0.0) is not None  # a free slot: taken whatever the value
    policy.complete(0, 4)
    _load(policy, 0, 1)
    for _ in range(50):
        policy.record(0, np.array([4, 1]))  # keep values near 1
    before = policy.page_table.copy()
    rate = float(policy.use_rate(0)[1])
    assert policy.admit_over(0, 6, rate) is None  # not above the coldest: refused, nothing changed
    assert (policy.page_table == before).all()
    for _ in range(300):
        policy.record(0, np.array([4, 6]))  # 1 cools down, 6 heats up
    policy.pin(0, 4)
    slot, evicted = policy.admit_over(0, 6, float(policy.use_rate(0)[6]))
    assert evicted == 1 and policy.slot_state[slot] == LOADING and policy.lookup(0, 1) is None
    assert policy.admit_over(0, 7, 1e9) is None  # left: one pinned, one loading; neither is a victim


def test_seeded_counts_give_the_initial_placement():
    counts = np.zeros((2, 8))
    counts[0, [5, 2, 7]] = [30, 20, 10]
    counts[1, [1, 3]] = [5, 40]
    policy = _policy(2, n_layers=2)
    policy.seed_counts(counts, n_tokens=30)
    assert policy.initial_placement() == [(0, 5), (0, 2), (1, 3), (1, 1)]
    assert policy.use_rate(0)[5] == pytest.approx(1.0)
    with pytest.raises(StrataError, match=r"expected non-negative \[2, 8\]"):
        policy.seed_counts(counts[:1], n_tokens=30)


# ---- invariants under random traffic -----------------------------------------------------------

def _random_operation(policy: ExpertPolicy, rng: np.random.Generator, pins: list) -> None:
    layer, expert = int(rng.integers(policy.n_layers)), int(rng.integers(policy.n_experts))
    op = rng.integers(7)
    slot = policy.lookup(layer, expert)
    if op == 0:
        policy.record(layer, rng.choice(policy.n_experts, size=2, replace=False))
    elif op == 1:
        policy.hint(layer, rng.choice(policy.n_experts, size=3, replace=False), rng.random(3))
    elif op in (2, 3) and slot is None:
        frozen = {s: policy.slot_expert[s] for s in range(policy.n_slots)
                  if policy.slot_pins[s] or policy.slot_state[s] == LOADING}
        try:
            got = policy.admit(layer, expert) if op == 2 else policy.admit_prefetch(layer, expert, rng.random())
        except PoolExhaustedError:
            got = None
        if got is not None:
            assert got[0] not in frozen, "a pinned slot or a load in flight was evicted"
        assert all(policy.slot_expert[s] == e for s, e in frozen.items())
    elif op == 4 and slot is not None and policy.slot_state[slot] == LOADING:
        if rng.random() < 0.9:
            policy.complete(layer, expert)
        elif policy.slot_pins[slot]:
            with pytest.raises(StrataError, match="unpin before abandoning its load"):
                policy.cancel(layer, expert)
        else:
            policy.cancel(layer, expert)
    elif op == 5 and slot is not None:
        policy.pin(layer, expert)
        pins.append((layer, expert))
    elif op == 6 and pins:
        policy.unpin(*pins.pop(int(rng.integers(len(pins)))))


@pytest.mark.parametrize("seed", range(4))
def test_page_table_matches_lookups_under_random_traffic(seed):
    rng = np.random.default_rng(seed)
    policy = ExpertPolicy(3, 10, [2, 3, 4], top_k=2, config=PolicyConfig(half_life_steps=8))
    pins: list = []
    for _ in range(1500):
        _random_operation(policy, rng, pins)
        _check_consistent(policy)
    assert sorted(pins) == sorted((int(policy.first_slot.searchsorted(s, "right") - 1), int(policy.slot_expert[s]))
                                  for s in range(policy.n_slots) for _ in range(policy.slot_pins[s]))


def test_no_allocation_grows_with_traffic():
    rng = np.random.default_rng(1)
    steps = rng.integers(0, 64, size=(1600, 8, 6))
    indices = np.sort(steps, axis=-1).transpose(1, 0, 2)  # [L, T, K], duplicates possible: fine
    policy = ExpertPolicy(8, 64, 16, top_k=6)
    arrays = [policy.page_table, policy.slot_expert, policy.slot_state, policy.slot_pins]

    def run(tokens):
        for t in tokens:
            for layer in range(8):
                policy.record(layer, indices[layer, t])
                policy.hint(layer, indices[layer, t][:3], 0.5)
                for e in np.unique(indices[layer, t]):
                    if policy.lookup(layer, e) is None:
                        _load(policy, layer, e)

    run(range(100))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    run(range(100, 1600))
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 4096, f"policy memory grew by {grown} bytes over 1500 tokens"
    assert all(a is b for a, b in zip(arrays, [policy.page_table, policy.slot_expert, policy.slot_state,
                                               policy.slot_pins]))


# ---- predictor -------------------------------------------------------------------------------------

def test_unfitted_predictor_says_uniform_rate():
    predictor = CooccurrencePredictor(3, 8, 2)
    assert np.allclose(predictor.probabilities(0, np.array([0, 1])), 2 / 8)


def test_predictor_learns_a_mapping_and_follows_its_change():
    rng = np.random.default_rng(0)
    predictor = CooccurrencePredictor(2, 16, 2, half_life_tokens=50)

    def train(mapping, tokens):
        for _ in range(tokens):
            src = rng.choice(16, size=2, replace=False)
            predictor.observe(0, src)
            predictor.observe(1, mapping[src])

    def recall(mapping):
        src = np.array([3, 9])
        (layer, ids, probs), = predictor.predict(0, src)
        assert layer == 1 and probs[0] >= probs[1]
        return np.isin(mapping[src], ids).mean()

    shift_one, shift_five = (np.arange(16) + 1) % 16, (np.arange(16) + 5) % 16
    train(shift_one, 600)
    assert recall(shift_one) == 1.0
    train(shift_five, 600)  # 12 half-lives later the old mapping has faded
    assert recall(shift_five) == 1.0


def test_batched_observations_equal_token_by_token_ones():
    rng = np.random.default_rng(2)
    steps = [rng.choice(10, size=(2, 3, 3), replace=True) for _ in range(20)]  # [B, L, K] per step
    steps = [np.sort(s, axis=-1) for s in steps if all(len(set(r)) == 3 for b in s for r in b)]
    batched = CooccurrencePredictor(3, 10, 3, max_batch=2)
    single = CooccurrencePredictor(3, 10, 3)
    for s in steps:
        for layer in range(3):
            batched.observe(layer, s[:, layer])
        for row in s:
            for layer in range(3):
                single.observe(layer, row[layer])
    assert np.allclose(batched.pair, single.pair) and np.allclose(batched.n, single.n)


def test_predictor_recall_on_the_trace(trace):
    # README: co-occurrence counts fitted on tokens 0-1023 reach top-6 recall 0.447 on 1024-2047.
    assert predictor_recall(trace, 1, fit_tokens=1024)[0] >= 0.447
    online = predictor_recall(trace, 2)
    assert online[0] > 0.44 and online[1] > 0.35  # static frequency: 0.108; chance: 0.094


# ---- replay --------------------------------------------------------------------------------------

def test_baselines_on_a_hand_worked_sequence():
    seq = np.array([0, 1, 2, 0, 1, 2])[None, :, None]  # [L=1, T=6, K=1]
    assert replay_lru(seq, 2).hits.sum() == 0  # cyclic access: LRU always evicts the next one
    assert replay_belady(seq, 2).hits.sum() == 2  # keeps 0 for t=3, then 2 for t=5
    assert replay_fixed(seq, 2).hits.sum() == 4  # {0, 1}


def test_baselines_reproduce_the_trace_readme(trace):
    for slots, (lru, belady, fixed) in README_TABLE.items():
        assert replay_lru(trace, slots).hit_rate == pytest.approx(lru, abs=6e-4)
        assert replay_belady(trace, slots).hit_rate == pytest.approx(belady, abs=6e-4)
        assert replay_fixed(trace, slots).hit_rate == pytest.approx(fixed, abs=6e-4)


@pytest.mark.parametrize("slots", [16, 32])
def test_policy_beats_lru_and_the_best_fixed_hot_set(trace, policy_runs, slots):
    lru, belady, fixed = README_TABLE[slots]
    run = policy_runs[slots]
    assert run.hit_rate > fixed + 0.02 and run.hit_rate > lru + 0.05
    # ... without buying hits with bandwidth: it loads no more experts than LRU does
    assert run.summary()["loads_per_request"] <= replay_lru(trace, slots).summary()["loads_per_request"]


def test_policy_decisions_use_only_the_past(trace, policy_runs):
    """Replaying a prefix, or the trace with its future replaced by noise, makes the very same
    decisions up to the cut: nothing the policy or predictor does can depend on later tokens."""
    cut, slots = 300, 16
    n_layers = trace.shape[0]
    noisy = trace.copy()
    noisy[:, cut:] = np.random.default_rng(0).permutation(64)[noisy[:, cut:]]  # relabelled future

    def snapshot_at_cut(indices):
        snaps = {}

        def on_step(t, layer, policy):
            if t == cut - 1 and layer == n_layers - 1:
                snaps["page_table"] = policy.page_table.copy()
        return snaps, on_step

    runs = {}
    for name, indices in (("prefix", trace[:, :cut]), ("noisy", noisy)):
        snaps, on_step = snapshot_at_cut(indices)
        runs[name] = (replay_policy(indices, slots, n_experts=64, on_step=on_step), snaps)
    full = policy_runs[slots]
    assert np.array_equal(runs["prefix"][0].hits, full.hits[:, :cut])
    assert np.array_equal(runs["noisy"][0].hits[:, :cut], full.hits[:, :cut])
    assert np.array_equal(runs["prefix"][1]["page_table"], runs["noisy"][1]["page_table"])
    assert not np.array_equal(runs["noisy"][0].hits, full.hits)  # the future did change


def test_demand_only_policy_runs_without_prefetch(trace):
    run = replay_policy(trace[:, :256], 16, ReplayConfig(prefetch_depth=0), n_experts=64)
    assert run.prefetch_loads == 0 and run.demand_loads == run.requests - run.hits.sum()


# ---- `strata bench cache` ------------------------------------------------------------------------

def _tiny_trace(path: Path) -> Path:
    rng = np.random.default_rng(3)
    indices = np.stack([[rng.choice(8, size=2, replace=False) for _ in range(60)] for _ in range(3)])
    np.savez(path, indices=indices.astype(np.int16))  # [L=3, T=60, K=2]
    return path


def test_bench_cache_json(tmp_path, capsys):
    from strata.cli import main

    trace = _tiny_trace(tmp_path / "t.npz")
    assert main(["bench", "cache", "--trace", str(trace), "--slots", "2", "4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["slots"]) == {"2", "4"}
    row = result["slots"]["4"]
    assert set(row) == {"policy", "policy_no_prefetch", "lru", "fixed", "belady"}
    assert row["belady"]["hit_rate"] >= row["lru"]["hit_rate"]
    assert main(["bench", "cache", "--trace", str(trace), "--slots", "4", "--prefetch-depth", "2"]) == 0
    assert "Belady*" in capsys.readouterr().out


def test_bench_cache_refuses_bad_input(tmp_path, capsys):
    from strata.cli import main

    trace = _tiny_trace(tmp_path / "t.npz")
    assert main(["bench", "cache", "--trace", str(trace), "--slots", "1"]) == 1
    assert "--slots 1: each layer needs between 2 (its top-k) and 8" in capsys.readouterr().err
    bad = tmp_path / "bad.npz"
    np.savez(bad, other=np.zeros(3))
    with pytest.raises(StrataFormatError, match="no 'indices' array"):
        load_trace(bad)
    np.savez(bad, indices=np.array([[[1, 2], [3, 3]]], dtype=np.int16))
    with pytest.raises(StrataFormatError, match=r"token 1 at layer 0 chose an expert twice \(\[3, 3\]\)"):
        load_trace(bad)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    assert main(["bench", "cache", "--trace", str(tmp_path / "junk.npz")]) == 1
    assert "not a readable .npz routing trace" in capsys.readouterr().err


def test_find_trace_takes_strata_trace_then_shared_beside_the_checkout(tmp_path, monkeypatch):
    """STRATA_TRACE names the file or its folder (CI exports ../shared/traces); without it the
    shared folder beside the checkout or beside one of its parents."""
    checkout = tmp_path / "ci" / "work" / "strata"
    checkout.mkdir(parents=True)
    beside = tmp_path / "ci" / "shared" / "traces"
    beside.mkdir(parents=True)
    (beside / TRACE_NAME).write_bytes(b"x")
    monkeypatch.delenv("STRATA_TRACE", raising=False)
    assert find_trace(TRACE_NAME, checkout) == beside / TRACE_NAME
    assert find_trace("other.npz", checkout) is None
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / TRACE_NAME).write_bytes(b"y")
    monkeypatch.setenv("STRATA_TRACE", str(elsewhere))
    assert find_trace(TRACE_NAME, checkout) == elsewhere / TRACE_NAME
    monkeypatch.setenv("STRATA_TRACE", str(elsewhere / TRACE_NAME))
    assert find_trace(TRACE_NAME, checkout) == elsewhere / TRACE_NAME
