"""Host tier: budgets refused with clear messages; one allocation, ever; loaded bytes equal the
file's and dequantize like them; slots reused; eviction never takes a slot being loaded or pinned."""
import gc
import shutil
import threading
import tracemalloc

import numpy as np
import pytest

from strata import native
from strata.errors import NativeError, StrataError
from strata.gguf import open_model
from strata.memory import host as host_module
from strata.memory.host import HostTier, slot_layout
from strata.memory.machine import machine_memory
from strata.memory.policy import LOADING, PoolExhaustedError
from tests.gguf.fixtures import Dims, write_deepseek2, write_qwen3moe

DIMS = Dims(n_layers=3, n_experts=8, n_experts_used=2, n_ff_exp=512)  # slots of ~290 KB


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("host") / "qwen3moe.gguf"
    write_qwen3moe(path, DIMS)
    return path


@pytest.fixture
def model(model_path):
    with open_model(model_path) as mf:
        yield mf


def slot_bytes(model) -> int:
    with native.Pager(model.path) as pager:
        return slot_layout(model, pager.info.align).slot_bytes


def tier(model, slots_per_layer: int, **kw) -> HostTier:
    """A host tier with exactly `slots_per_layer` slots in each expert layer."""
    return HostTier(model, slots_per_layer * len(model.expert_layers) * slot_bytes(model), n_threads=2, **kw)


def assert_expert_bytes(model, expert) -> None:
    for slab, view in zip(expert.slabs, expert.parts):
        assert np.array_equal(view, model.expert_data(slab)), slab


# ---- budgets -------------------------------------------------------------------------------

def test_bad_budgets_are_refused_with_a_reason(model):
    total = machine_memory()[0]
    minimum = len(model.expert_layers) * DIMS.n_experts_used * slot_bytes(model)
    cases = {
        0: "must be positive, found 0 bytes",
        -(1 << 30): "must be positive, found -1073741824 bytes",
        total + 1: r"larger than this machine's RAM \(",
        minimum - 1: rf"too small for .*qwen3moe.gguf: each of its 3 expert layers needs slots for its "
                     rf"top-2 experts at once, .* at least {minimum} bytes",
        "8G": "must be a whole number of bytes, found '8G'",
        1.5e9: "must be a whole number of bytes",
        True: "must be a whole number of bytes",
    }
    for budget, message in cases.items():
        with pytest.raises(ValueError, match=message) as info:
            HostTier(model, budget)
        assert isinstance(info.value, StrataError)  # the CLI prints it as one line
    with HostTier(model, minimum) as host:  # the smallest budget that works
        assert host.slots_per_layer == DIMS.n_experts_used


def test_default_budget_holds_a_small_model_whole(model):
    with HostTier(model) as host:
        assert host.slots_per_layer == DIMS.n_experts
        assert host.pool.nbytes == host.n_slots * host.layout.slot_bytes


def test_model_without_experts_in_a_layer_gets_no_slots_there(tmp_path):
    path = tmp_path / "deepseek2.gguf"
    write_deepseek2(path, DIMS)  # layer 0 is a dense lead layer
    with open_model(path) as mf, HostTier(mf) as host:
        assert mf.expert_layers == [1, 2] and host.policy.n_layers == 2
        assert_expert_bytes(mf, host.acquire(2, 5))
        with pytest.raises(StrataError, match="layer 0 has no routed experts"):
            host.load(0, 1)


# ---- bytes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [dict(direct=True), dict(direct=False), dict(direct=False, fallback="mmap")])
def test_loaded_experts_equal_the_file_and_dequantize_alike(model, mode):
    with tier(model, DIMS.n_experts, **mode) as host:
        assert host.pool.ctypes.data % host_module.PAGE == 0
        loads = [host.load(layer, e) for layer in model.expert_layers for e in range(DIMS.n_experts)]
        for load in loads:
            expert = host.wait(load)
            assert_expert_bytes(model, expert)
            for slab, view in zip(expert.slabs, expert.parts):
                out = np.empty(slab.shape, np.float32)
                native.dequantize_into(slab.ggml_type, view, out)
                want = native.dequantize(slab.ggml_type, model.expert_data(slab), slab.shape)
                assert np.array_equal(out.view(np.uint32), want.view(np.uint32))  # random scales: NaNs too
        stats = host.stats()
    assert stats["misses"] == len(loads) and stats["hits"] == 0
    assert stats["pager"]["direct"] == (3 * len(loads) if mode.get("direct") else 0)


def test_hits_and_loads_in_flight_are_shared(model):
    with tier(model, 4) as host:
        first = host.load(1, 3)
        assert host.load(1, 3) is first  # in flight: the same load
        assert_expert_bytes(model, host.wait(first))
        again = host.load(1, 3)
        assert again.hit and again is not first
        assert host.wait(again).slot == first.slot
        assert host.stats()["hits"] == 1 and host.stats()["misses"] == 1


# ---- allocation once, slots reused ---------------------------------------------------------

def test_pool_is_allocated_once_and_loads_allocate_no_buffers(model, monkeypatch):
    calls = []
    real = host_module._allocate
    monkeypatch.setattr(host_module, "_allocate", lambda n, pinned: calls.append(n) or real(n, pinned))
    rng = np.random.default_rng(0)
    with tier(model, 3) as host:
        assert calls == [host.n_slots * host.layout.slot_bytes]
        def steps(n):
            for _ in range(n):
                layer = int(rng.choice(model.expert_layers))
                for e in rng.choice(DIMS.n_experts, DIMS.n_experts_used, replace=False):
                    expert = host.wait(host.load(layer, int(e)))
                    assert all(np.shares_memory(view, host.pool) for view in expert.parts)

        steps(30)  # warm-up: first-use caches of numpy and the policy
        gc.collect()  # empties the interpreter's free lists, which the loop below refills
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        steps(300)
        peak = tracemalloc.get_traced_memory()[1] - base
        gc.collect()
        growth = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        assert calls == [host.n_slots * host.layout.slot_bytes]
        assert host.stats()["evictions"] > 100
        assert peak < host.layout.slot_bytes / 4  # bookkeeping only: no buffer the size of a slot
        assert growth < 16384


def test_slots_are_reused_and_bytes_follow_the_page_table(model):
    with tier(model, 2) as host:
        slots = set()
        for e in range(DIMS.n_experts):
            expert = host.acquire(2, e)
            assert_expert_bytes(model, expert)
            slots.add(expert.slot)
            host.unpin(2, e)
        assert len(slots) == 2 and slots <= set(range(host.n_slots))
        assert host.stats()["evictions"] == DIMS.n_experts - 2
        resident = host.policy.resident(host._index(2))
        for e in resident:
            assert_expert_bytes(model, host.view(2, int(e)))


# ---- eviction respects loads and pins ------------------------------------------------------

def test_eviction_never_takes_a_loading_or_pinned_slot(model):
    with tier(model, 3) as host:
        pinned = host.acquire(1, 0)           # READY and pinned
        loading = host.load(1, 1)             # LOADING until collected
        ready_load = host.load(1, 2)
        ready = host.wait(ready_load)         # READY, unpinned: the only possible victim
        assert host.policy.slot_state[loading.slot] == LOADING
        newcomer = host.load(1, 3)
        assert newcomer.slot == ready.slot
        with pytest.raises(PoolExhaustedError, match="all 3 of its slots are in use"):
            host.load(1, 4)               # pinned, loading, loading: nothing to evict
        assert_expert_bytes(model, host.wait(loading))
        assert_expert_bytes(model, host.wait(newcomer))
        assert_expert_bytes(model, pinned)   # untouched by the loads around it
        with pytest.raises(StrataError, match="expert 2 of layer 1 was evicted from slot"):
            host.wait(ready_load)  # a finished load whose expert has been evicted since
        host.unpin(1, 0)


def test_random_traffic_never_evicts_pinned_or_loading(model):
    rng = np.random.default_rng(4)
    with tier(model, 4) as host:
        pins: list[tuple[int, int]] = []
        pending = []
        for step in range(400):
            layer = int(rng.choice(model.expert_layers))
            li = host._index(layer)
            protected = {int(s) for s in np.flatnonzero((host.policy.slot_pins > 0) |
                                                         (host.policy.slot_state == LOADING))}
            expert = int(rng.integers(DIMS.n_experts))
            try:
                load = host.load(layer, expert)
            except PoolExhaustedError:
                lo, hi = host.policy.first_slot[li], host.policy.first_slot[li + 1]
                assert set(range(lo, hi)) <= protected
                load = None
            if load is not None and not load.hit and load not in pending:
                assert load.slot not in protected
                pending.append(load)
            if pending and rng.random() < 0.5:
                done = pending.pop(int(rng.integers(len(pending))))
                expert = host.wait(done, pin=rng.random() < 0.5)
                assert_expert_bytes(model, expert)
                if host.policy.slot_pins[done.slot]:
                    pins.append((done.layer, done.expert))
            if pins and rng.random() < 0.4:
                host.unpin(*pins.pop(int(rng.integers(len(pins)))))
            for layer_, expert_ in pins:  # pinned bytes never change underneath
                assert_expert_bytes(model, host.view(layer_, expert_))


def test_prefetch_takes_free_slots_and_spares_hot_experts(model):
    with tier(model, 2) as host:
        hinted = host.prefetch(1, 5, prob=0.9)
        assert hinted is not None and hinted.prefetch
        assert_expert_bytes(model, host.wait(hinted))
        for _ in range(20):
            host.record(1, np.array([[5, 6]]))
        assert_expert_bytes(model, host.wait(host.load(1, 6)))
        assert host.prefetch(1, 7, prob=0.05) is None  # would displace experts used every step
        assert host.stats()["refused_prefetches"] == 1


# ---- failures and threads ------------------------------------------------------------------

def test_failed_read_cancels_the_slot(model_path, tmp_path):
    path = shutil.copy(model_path, tmp_path / "shrinks.gguf")
    with open_model(path) as mf, tier(mf, 2) as host:
        last = mf.expert(2, DIMS.n_experts - 1, "down")
        with open(path, "r+b") as f:
            f.truncate(last.offset)  # the last expert's down slab is gone
        load = host.load(2, DIMS.n_experts - 1)
        with pytest.raises(NativeError, match=rf"shrinks.gguf: read of bytes \[{last.offset}, .*the file ended"):
            host.wait(load)
        with pytest.raises(NativeError, match="the file ended"):
            host.wait(load)  # the same error for every waiter
        assert host.lookup(2, DIMS.n_experts - 1) is None
        assert host.stats()["failed_loads"] == 1
        assert_expert_bytes(mf, host.acquire(1, 0))  # the tier goes on


def test_concurrent_acquire_from_threads(model):
    failures = []
    with tier(model, 4) as host:
        def client(seed):
            rng = np.random.default_rng(seed)
            for _ in range(60):
                layer, expert = int(rng.choice(model.expert_layers)), int(rng.integers(DIMS.n_experts))
                try:
                    got = host.acquire(layer, expert)
                except (PoolExhaustedError, StrataError):
                    continue  # all slots of the layer held by the other clients, or evicted meanwhile
                try:
                    assert_expert_bytes(model, got)
                except AssertionError as exc:
                    failures.append(exc)
                finally:
                    host.unpin(layer, expert)

        threads = [threading.Thread(target=client, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not host.policy.slot_pins.any()
    assert failures == []


def test_close_with_loads_in_flight(model):
    host = tier(model, DIMS.n_experts)
    loads = [host.load(layer, e) for layer in model.expert_layers for e in range(DIMS.n_experts)]
    host.close()
    for load in loads:
        try:
            assert_expert_bytes(model, host.wait(load))
        except NativeError as exc:
            assert "pager is closed" in str(exc)


@pytest.mark.cuda
def test_pinned_pool_on_cuda(model):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with tier(model, 2, device="cuda") as host:
        expert = host.acquire(1, 3)
        pool = torch.from_numpy(host.pool)
        assert pool.is_pinned()
        on_device = torch.from_numpy(expert.down).to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        assert np.array_equal(on_device.cpu().numpy(), model.expert_data(expert.slabs[2]))


def test_loads_nobody_waits_for_are_reaped_when_a_layer_is_full(model):
    # prefetches whose device slots were given back are never waited for: their host slots would
    # stay LOADING and the layer refuse every load (a hang or a 'pool exhausted' error in decoding)
    layer = model.expert_layers[0]
    with tier(model, 2) as host:
        orphans = [host.prefetch(layer, e) for e in (0, 1)]
        assert all(o is not None and not o.done for o in orphans)
        with pytest.raises(PoolExhaustedError):
            host.load(layer, 2)
        assert host.reap(layer) == 2 and all(o.done for o in orphans)
        assert host.reap(layer) == 0
        got = host.wait(host.load(layer, 2))  # a finished, unpinned load is evicted to make room
        assert got is not None and host.is_ready(layer, 2)


def test_the_pool_asks_for_huge_pages_where_the_kernel_offers_them(monkeypatch):
    """With transparent huge pages in "madvise" (or "always") mode the pool is backed by 2 MiB
    pages once written (one page table entry per 2 MiB of experts); STRATA_HUGE_PAGES=0 leaves
    the kernel's default, which in "madvise" mode is 4 KiB pages."""
    from pathlib import Path
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.exists() or "[never]" in mode.read_text():
        pytest.skip("transparent huge pages are off on this machine")

    def huge_kib(pool) -> int:
        start = pool.ctypes.data
        lines = Path("/proc/self/smaps").read_text().splitlines()
        for i, line in enumerate(lines):
            lo, _, hi = line.split(" ", 1)[0].partition("-")
            if hi and int(lo, 16) <= start < int(hi, 16):
                field = next(x for x in lines[i + 1:] if x.startswith("AnonHugePages:"))
                return int(field.split()[1])
        raise AssertionError("the pool's mapping is not in /proc/self/smaps")

    pool = host_module._allocate(16 << 20, pinned=False)
    pool[:] = 1
    assert huge_kib(pool) >= 2048
    if "[madvise]" in mode.read_text():
        monkeypatch.setattr(host_module, "HUGE_PAGES", False)
        plain = host_module._allocate(16 << 20, pinned=False)
        plain[:] = 1
        assert huge_kib(plain) == 0
