"""Tiered expert memory, end to end on the CPU device: a model whose experts are 4x the device slot
pool and 2x the host budget gives exactly the all-resident logits and greedy tokens (both slot
forms, prefetch off and on); decoding allocates nothing; statistics add up; slots hold the file's
experts; budgets are refused with one clear line."""
from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest
import torch

import strata
from strata import native
from strata.cli import main
from strata.errors import StrataError
from strata.gguf import open_model
from strata.memory.alloc import ALLOCATIONS
from strata.memory.host import BudgetError
from strata.memory.machine import machine_memory
from strata.memory.paged import PagedExpertMemory
from strata.memory.policy import READY
from strata.memory.tiered import TieredConfig, TieredExpertMemory

from .tiered_fixture import (DEVICE_SLOTS, FORMS, GREEDY, HOST_SLOTS, N_EXPERTS, TOP_K, budgets, load_tiered, moe_file,
                             prompt, tiered)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def path():
    return moe_file()


@pytest.fixture(scope="module")
def references(path):
    """The all-resident run (DirectExpertMemory) of each compute: logits of a prompt, greedy
    tokens, a batch."""
    runs = {}

    def get(compute):
        if compute not in runs:
            with strata.load(path, memory="direct", threads=1, n_ctx=256, compute=compute) as m:
                ids = prompt(24)
                runs[compute] = {
                    "logits": m.logits(ids), "greedy": m.generate(ids, max_tokens=32, **GREEDY).token_ids,
                    "batch": [c.token_ids for c in m.generate_batch([prompt(5, 1), prompt(17, 2), prompt(9, 3)],
                                                                    max_tokens=12, **GREEDY)]}
        return runs[compute]

    return get


@pytest.mark.parametrize("depth", [0, 1, 2], ids=lambda d: f"prefetch{d}")
@pytest.mark.parametrize("form", FORMS)
def test_logits_and_greedy_tokens_equal_the_all_resident_run(path, references, form, depth):
    reference = references("float")
    with load_tiered(path, form, depth) as m:
        mem = m.memory
        assert (mem.plan.slots_per_layer, mem.host.slots_per_layer) == (DEVICE_SLOTS, HOST_SLOTS)
        assert N_EXPERTS == 4 * DEVICE_SLOTS == 2 * HOST_SLOTS
        assert torch.equal(m.logits(prompt(24)), reference["logits"])
        assert m.generate(prompt(24), max_tokens=32, **GREEDY).token_ids == reference["greedy"]
        t = m.memory_stats().totals()
        # all three tiers served (by demand loads or, timing permitting, by prefetches)
        assert t["disk_reads"] + t["prefetch_disk_reads"] > 0 and t["evictions"] > 0
        assert t["host_hits"] + t["prefetch_host_hits"] > 0 and t["device_hits"] > 0
        assert (t["prefetch_issued"] > 0) == (depth > 0)


@pytest.mark.parametrize("form", FORMS)
def test_batched_decoding_equals_the_all_resident_run(path, references, form):
    # three sequences route to up to 6 experts per layer: acquired in chunks of max_acquire
    reference = references("float")
    with load_tiered(path, form) as m:
        assert m.memory.max_acquire == TOP_K
        got = m.generate_batch([prompt(5, 1), prompt(17, 2), prompt(9, 3)], max_tokens=12, **GREEDY)
        assert [c.token_ids for c in got] == reference["batch"]


def _traced_decode(m, ids: list[int], n: int):
    """After a warm-up (torch's and numpy's first calls), generate n tokens from ids: (the
    completion, the memory system's allocation counter before it, bytes of Python and numpy
    objects it left behind)."""
    m.generate(prompt(8), max_tokens=4, **GREEDY)
    before = ALLOCATIONS.snapshot()
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        done = m.generate(ids, max_tokens=n, **GREEDY)
        gc.collect()  # cyclic garbage is not kept memory
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    return done, before, grown


@pytest.mark.parametrize("form", FORMS)
def test_decoding_allocates_nothing_after_start_up(path, form):
    with load_tiered(path, form, depth=2) as m:
        done, before, grown = _traced_decode(m, prompt(8, 5), 64)
        assert len(done.token_ids) == 64
        assert ALLOCATIONS.snapshot() == before  # no slot, scratch, staging or host buffer made
        # numpy and Python objects traced: nothing near the size of one slot (>= 100 KB) stays behind
        assert grown < 64 << 10, grown
        stats = m.memory_stats()
        assert stats.total("disk_reads") + stats.total("prefetch_disk_reads") > 0  # the run did load experts


def test_statistics_add_up(path):
    with load_tiered(path, "dequantized", depth=1) as m:
        acquired = []
        start = m.memory.start

        def counting(layer, ids):
            acquired.append(len(ids))
            return start(layer, ids)

        m.memory.start = counting
        m.generate(prompt(12), max_tokens=24, **GREEDY)
        mem, s = m.memory, m.memory_stats()
        assert s.total("requests") == sum(acquired)
        assert np.array_equal(s.requests, s.device_hits + s.device_late + s.device_misses)
        assert np.array_equal(s.device_misses, s.host_hits + s.disk_reads)
        expert_bytes = [sum(x.nbytes for x in mem.model_file.expert_slabs(layer, 0)) for layer in mem.layers]
        assert np.array_equal(s.bytes_disk, (s.disk_reads + s.prefetch_disk_reads) * expert_bytes)
        assert s.total("bytes_disk") == mem.host.stats()["bytes_loaded"]
        fills = s.host_hits + s.disk_reads + s.prefetch_host_hits + s.prefetch_disk_reads
        assert np.array_equal(s.bytes_to_device, fills * mem.geometry.slot_bytes("dequantized", torch.float32))
        t = s.totals()
        assert 0 < t["precision"] <= 1 and 0 < t["recall"] <= 1 and t["predicted_correct"] <= t["actual"]
        assert t["prefetch_used"] <= t["prefetch_issued"] and t["wait_s"] > 0 and t["dequant_s"] > 0
        assert s.to_dict()["total"]["requests"] == sum(acquired)  # strata.commands.tiers formats it
        s.reset()
        assert s.total("requests") == 0


@pytest.mark.parametrize("form", FORMS)
def test_slots_hold_the_files_experts_and_the_page_table_mirrors_the_policy(path, form):
    with load_tiered(path, form, depth=1) as m:
        m.generate(prompt(10), max_tokens=16, **GREEDY)
        mem, mf = m.memory, m.model_file
        mem.close()  # the loader is stopped: nothing moves while we look
        assert torch.equal(mem.page_table, torch.from_numpy(mem.policy.page_table))
        for li, layer in enumerate(mem.layers):
            for e in mem.policy.resident(li):
                slot = mem.policy.lookup(li, int(e))
                assert mem.policy.slot_state[slot] == READY and mem.policy.slot_pins[slot] == 0
                got, _ = mem.slots.weights(slot, mf.expert_slabs(layer, int(e)), 0)
                for slab, tensor in zip(mf.expert_slabs(layer, int(e)), (got.gate, got.up, got.down)):
                    want = native.dequantize(slab.ggml_type, mf.expert_data(slab), slab.shape)
                    assert np.array_equal(tensor.numpy(), want), (layer, int(e), slab.part)


def test_prefetch_only_moves_bytes_a_wrong_prediction_costs_no_result(path, references):
    reference = references("float")
    with load_tiered(path, "dequantized", depth=1) as m:
        mem = m.memory
        for layer in mem.layers:  # announce every other expert of every layer: most of it is wrong
            mem.prefetch(layer, list(range(1, N_EXPERTS, 2)), [0.9] * (N_EXPERTS // 2))
        assert torch.equal(m.logits(prompt(24)), reference["logits"])
        assert m.memory_stats().total("prefetch_issued") > 0


def test_default_budgets_hold_a_small_model_whole(path, references):
    with strata.load(path, threads=1, n_ctx=256, compute="float") as m:
        assert m.memory.plan.form == "dequantized" and m.memory.plan.slots_per_layer == N_EXPERTS
        assert m.generate(prompt(24), max_tokens=32, **GREEDY).token_ids == references("float")["greedy"]
    # packed compute: memory='tiered' is served by the paged memory, whose default holds the model too
    with strata.load(path, threads=1, n_ctx=256, memory="tiered") as m:
        assert isinstance(m.memory, PagedExpertMemory) and m.memory.max_acquire == N_EXPERTS
        assert m.plan.memory == "paged" and "memory='tiered' with packed compute" in m.plan.memory_why
        assert m.generate(prompt(24), max_tokens=32, **GREEDY).token_ids == references("packed")["greedy"]
    with strata.load(path, threads=1, n_ctx=256) as m:  # the CPU's default on a file that fits and is cached:
        assert m.plan.memory == "direct"  # packed compute on its experts read in place (tests/engine/test_memory_choice.py)
        assert m.generate(prompt(24), max_tokens=32, **GREEDY).token_ids == references("packed")["greedy"]


def test_paged_memory_decoding_allocates_nothing_after_start_up(path, references):
    """The CPU's default memory under a budget that evicts: no buffer made while decoding, nothing
    near a slot's size left behind, and the all-resident run's tokens."""
    from strata.memory.budget import host_budget_for_slots

    with open_model(path) as mf:
        host_mem = host_budget_for_slots(mf, TOP_K + 1)
    want = references("packed")["greedy"]  # loaded first: its model's buffers are not the decode's
    with strata.load(path, threads=1, n_ctx=256, memory="paged", host_mem=host_mem) as m:
        assert m.memory.max_acquire == TOP_K + 1 < N_EXPERTS
        done, before, grown = _traced_decode(m, prompt(24), 32)
        assert done.token_ids == want
        assert ALLOCATIONS.snapshot() == before
        assert grown < 64 << 10, grown
        t = m.memory_stats().totals()
        assert t["disk_reads"] > 0 and t["evictions"] > 0


# ---- budgets ----------------------------------------------------------------------------------

def test_bad_budgets_are_refused_with_a_reason(path):
    device_min, host_min = budgets(path, "dequantized", device_slots=TOP_K, host_slots=TOP_K)
    total = machine_memory()[0]
    cases = [
        (dict(device_mem=0), r"^device_mem: expected a positive number of bytes such as 512M or 8G, found 0$"),
        (dict(device_mem=-5), r"device_mem: .*found -5$"),
        (dict(device_mem="-1G"), r"device_mem: .*found '-1G'$"),
        (dict(device_mem="lots"), r"device_mem: expected a positive number of bytes such as 512M or 8G, found 'lots'"),
        (dict(host_mem=0), r"host_mem: expected a positive number of bytes"),
        (dict(device_mem=total + 1), r"larger than the cpu device's memory"),
        (dict(host_mem=total + 1), r"larger than this machine's RAM"),
        (dict(host_mem=host_min - 1), rf"too small for .*: each of its 3 expert layers needs slots for its "
                                      rf"top-2 experts at once, .* at least {host_min} bytes"),
        (dict(prefetch_depth=-1), r"prefetch_depth: expected an integer >= 0, found -1"),
        (dict(slot_form="squashed"), r"slot_form: expected one of 'dequantized', 'packed', found 'squashed'"),
    ]
    for kwargs, message in cases:  # the tiered memory's budgets (float compute: it serves it on the CPU)
        with pytest.raises((StrataError, ValueError), match=message):
            strata.load(path, threads=1, n_ctx=256, compute="float", **kwargs)
    with open_model(path) as mf, pytest.raises(BudgetError, match=(
            rf"too small for .*moe-q4_k.gguf: after resident weights and KV cache \(0.0 MiB\), each of its 3 expert "
            rf"layers needs dequantized slots for its top-2 experts at once, 786432 bytes per slot, so at least "
            rf"{device_min} bytes")):
        TieredExpertMemory(mf, config=TieredConfig(device_mem=device_min - 1, slot_form="dequantized"))
    # the smallest budgets that work, work
    with strata.load(path, threads=1, n_ctx=256, memory=tiered(path, "dequantized")) as m:
        m.generate(prompt(4), max_tokens=2)


def test_resident_weights_alone_exceeding_the_device_budget_is_said_so(path):
    with pytest.raises(BudgetError, match=r"resident weights and KV cache alone \(.* MiB\) exceed the device memory "
                                          r"budget \(1.0 MiB\); raise --device-mem"):
        strata.load(path, threads=1, n_ctx=256, device_mem="1M", compute="float")
    # packed compute: the paged memory serves memory='tiered' from device_mem less those, plus host_mem
    with pytest.raises(StrataError, match=r"^device_mem=1048576: the resident weights and KV cache take \d+ bytes "
                                          r"of it, nothing is left for experts; give a larger device_mem or a host_mem$"):
        strata.load(path, threads=1, n_ctx=256, device_mem="1M")


def test_cli_budget_errors_are_one_line_and_a_non_zero_exit(path, capsys):
    for args in (["--device-mem", "0"], ["--device-mem=-2G"], ["--host-mem", "1K"], ["--device-mem", "1M"],
                 ["--memory", "direct", "--device-mem", "1G"]):
        assert main(["generate", str(path), "-p", "hi", "-n", "2", *args]) == 1
        err = capsys.readouterr().err
        assert err.startswith("strata: error: ") and err.count("\n") == 1, err


def test_cli_stats_after_generate(path, capsys):
    device_mem, host_mem = budgets(path, "packed")
    flags = ["generate", str(path), "-p", "the expert router", "-n", "8", "--threads", "1", "--slot-form", "packed",
             "--device-mem", str(device_mem + (64 << 20)), "--host-mem", str(host_mem), "--stats"]
    assert main([*flags, "--prefetch-depth", "2", "--compute", "float"]) == 0
    err = capsys.readouterr().err
    assert "expert memory: " in err and "disk reads" in err and "prefetch: issued" in err
    assert "layer  requests" in err and "; memory: tiered — why: " in err
    # packed compute (the CPU's default): the paged memory serves the same flags, and --stats says so
    assert main(flags) == 0
    err = capsys.readouterr().err
    assert "; memory: paged — why: " in err and "memory: memory='tiered' with packed compute on the CPU" in err
    assert "expert memory: " in err and "prefetch: issued 0," in err
    assert main([*flags, "--prefetch-depth", "2"]) == 1  # it has no prefetch: refused in one line
    err = capsys.readouterr().err
    assert err.startswith("strata: error: prefetch_depth=2: with packed compute on the CPU the paged memory serves "
                          "memory='tiered'") and err.count("\n") == 1, err


def test_lookahead_announces_the_next_layers_from_the_current_hidden_state(path):
    with load_tiered(path, "dequantized", depth=2) as m:
        t = m.transformer
        assert [layer for layer, _, _ in t.lookahead.targets] == [0, 1]  # from the embeddings
        assert [[layer for layer, _, _ in b.lookahead.targets] for b in t.blocks[:2]] == [[1, 2], [2]]
        assert t.blocks[2].lookahead is None
    with strata.load(path, memory="direct", threads=1, n_ctx=256) as m:  # a memory without prefetch: no hook
        assert m.transformer.lookahead is None and all(b.lookahead is None for b in m.transformer.blocks)


def test_bench_tiered_compares_prefetch_depths_side_by_side(path, capsys):
    import json

    device_mem, host_mem = budgets(path, "packed")
    assert main(["bench", "tiered", str(path), "--tokens", "12", "--depths", "0", "2", "--threads", "1",
                 "--device-mem", str(device_mem + (64 << 20)), "--host-mem", str(host_mem), "--slot-form", "packed",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["same_tokens"] and set(r["by_depth"]) == {"0", "2"} and "2" in r["wait_ratio"]
    off, on = r["by_depth"]["0"], r["by_depth"]["2"]
    assert off["prefetch_issued"] == 0 < on["prefetch_issued"] and on["recall"] is not None
    assert off["requests"] == off["device_hits"] + off["device_late"] + off["device_misses"]


def test_an_unclosed_memory_is_collected_and_its_loader_stops(path):
    import threading
    import weakref

    m = load_tiered(path, "packed", depth=1)
    m.generate(prompt(6), max_tokens=4, stop_token_ids=())
    ref, thread = weakref.ref(m.memory), m.memory.loads.thread
    assert thread.is_alive()
    del m
    gc.collect()
    thread.join(timeout=5)
    assert ref() is None and not thread.is_alive()
    assert "strata-expert-loader" not in [t.name for t in threading.enumerate() if t is thread]


@pytest.mark.parametrize("form", FORMS)
def test_random_traffic_with_wrong_prefetches_always_hands_out_the_files_experts(path, form):
    """Compute and loader race on tight pools (2 device and 3 host slots per layer): random
    routing, random (mostly wrong) prefetches; every acquired expert must be the file's."""
    rng = np.random.default_rng(7)
    device_mem, host_mem = budgets(path, form, host_slots=3)
    with open_model(path) as mf:
        want = {(layer, e): [native.dequantize(s.ggml_type, mf.expert_data(s), s.shape) for s in mf.expert_slabs(layer, e)]
                for layer in mf.expert_layers for e in range(N_EXPERTS)}
        mem = TieredExpertMemory(mf, config=TieredConfig(device_mem=device_mem, host_mem=host_mem, slot_form=form,
                                                         prefetch_depth=1, cooccurrence=False), n_threads=1)
        try:
            for step in range(150):
                for layer in mem.layers:
                    routed = torch.from_numpy(rng.choice(N_EXPERTS, size=(1, TOP_K), replace=False))
                    mem.observe(layer, routed)
                    for ahead in mem.layers[layer + 1:layer + 3]:
                        mem.prefetch(ahead, rng.choice(N_EXPERTS, size=3, replace=False).tolist())
                    ids = sorted(routed[0].tolist())
                    for e, w in zip(ids, mem.acquire(layer, ids)):
                        for got, ref in zip((w.gate, w.up, w.down), want[layer, e]):
                            assert np.array_equal(got.numpy(), ref), (step, layer, e)
                    mem.release(layer, ids)
            s = mem.stats
            assert s.total("prefetch_issued") > 100 and s.total("device_late") + s.total("prefetch_used") > 0
            assert np.array_equal(s.requests, s.device_hits + s.device_late + s.device_misses)
        finally:
            mem.close()
        assert (mem.policy.slot_pins == 0).all() and (mem.host.policy.slot_pins == 0).all()
