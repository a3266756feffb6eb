"""The default expert memory of packed compute on the CPU, settled from the file at load: read in
place from the mapped file (direct) when the experts fit the RAM budget and sit in the page cache,
else paged into RAM slots (around the page cache, O_DIRECT, when they do not fit); the plan says
which and why, an explicit --memory is honoured, and both give the same tokens bit for bit."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

import strata
from strata.engine.build import settle_default
from strata.engine.config import MemoryConfig
from strata.gguf import open_model
from strata.memory.budget import host_budget_for_slots
from strata.memory.machine import Machine
from strata.memory.residency import expert_ranges, resident_share, sample_offsets
from strata.runtime.plan import PAGE_CACHE_SHARE, FileFit, default_memory_row
from tests.fixtures.tiny import zoo

GIB = 1 << 30


@pytest.fixture(scope="module")
def qwen3():
    return zoo().get("qwen3moe")


def _evict(path) -> None:
    """Drop `path`'s pages from the page cache (written to the disk first, so they can go)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture
def cold(qwen3, tmp_path):
    """A copy of the tiny file, opened, then dropped from the page cache (opening a file this small
    reads all of it; a real one's experts stay out); skipped where the file system keeps files in
    memory (tmpfs: no page cache to leave)."""
    path = tmp_path / "cold.gguf"
    shutil.copyfile(qwen3.gguf(None), path)
    with open_model(path) as mf:
        _evict(path)
        share = resident_share(mf)
        if share is None or share >= PAGE_CACHE_SHARE:
            pytest.skip("this file system keeps files in memory (no page cache to leave)")
        _evict(path)  # again: a probe's misses start the kernel's readahead, which a file this small fills
        yield mf


def _read(path) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass


# -- the plan's row: plain data -------------------------------------------------------------------

def test_the_row_maps_a_cached_file_that_fits_and_pages_the_others():
    kind, why = default_memory_row(FileFit(experts=GIB, budget=4 * GIB, resident=1.0))
    assert kind == "direct" and why.startswith("the file fits in RAM and is in the page cache (")
    assert "read in place from the mapped file" in why and "--memory paged" in why
    kind, why = default_memory_row(FileFit(experts=4 * GIB, budget=GIB, resident=1.0))
    assert kind == "paged" and why.startswith("the experts do not fit the RAM budget") and "O_DIRECT" in why
    kind, why = default_memory_row(FileFit(experts=GIB, budget=4 * GIB, resident=0.25))
    assert kind == "paged" and "not in the page cache (25% of" in why
    kind, why = default_memory_row(FileFit(experts=GIB, budget=4 * GIB, resident=None))
    assert kind == "paged" and "cannot be told" in why


def test_samples_spread_over_every_expert_range():
    assert sample_offsets([(0, 100), (1000, 1100)], 4) == [25, 75, 1025, 1075]
    assert sample_offsets([(0, 100)], 0) == []


# -- the probe -----------------------------------------------------------------------------------

def test_the_probe_tells_a_cached_file_from_an_evicted_one(cold):
    assert resident_share(cold) < PAGE_CACHE_SHARE
    assert len(expert_ranges(cold)) == 3 * len(cold.expert_layers)
    _read(cold.path)
    assert resident_share(cold) == 1.0


# -- load: what the plan says and what runs -------------------------------------------------------

def test_a_cached_file_that_fits_is_read_in_place_and_the_plan_says_why(qwen3):
    path = qwen3.gguf(None)
    _read(path)
    with strata.load(path, threads=1, n_ctx=64, max_batch=1) as m:
        assert type(m.memory).__name__ == "DirectExpertMemory" and m.plan.memory == "direct"
        assert m.plan.memory_why.startswith("the file fits in RAM and is in the page cache")
        assert "memory: direct — why: " in m.plan.describe()
        assert m.plan.decode == "program"  # the mapped experts never move: the whole decode step in one call
    with strata.load(path, threads=1, n_ctx=64, max_batch=1, memory="paged") as m:  # asked: honoured
        assert type(m.memory).__name__ == "PagedExpertMemory" and m.plan.memory_why == "as asked"


def test_a_budget_smaller_than_the_experts_keeps_the_paged_memory_and_o_direct(qwen3):
    path = qwen3.gguf(None)
    _read(path)
    with open_model(path) as mf:
        small = host_budget_for_slots(mf, mf.hparams.n_experts_used + 1)  # a few slots a layer, not every expert
    with strata.load(path, threads=1, n_ctx=64, max_batch=1, host_mem=small) as m:
        assert type(m.memory).__name__ == "PagedExpertMemory" and m.plan.memory == "paged"
        assert m.plan.memory_why.startswith("the experts do not fit the RAM budget") and "O_DIRECT" in m.plan.memory_why
        assert m.memory.host.slots_per_layer < m.memory.n_experts


def test_a_small_machine_budget_keeps_the_paged_memory(qwen3):
    """The machine's RAM as a memory cgroup would leave it (Machine.measure lowers it to the limit):
    its share is smaller than the experts, so they are paged whatever the page cache holds."""
    path = qwen3.gguf(None)
    _read(path)
    with open_model(path) as mf:
        every = host_budget_for_slots(mf, mf.hparams.n_experts)
        small, big = Machine(ram=(every, every), device=(every, every)), Machine(ram=(64 * every,) * 2,
                                                                                  device=(64 * every,) * 2)
        config = MemoryConfig("paged")
        args = (None, {}, config, "the default for packed compute", mf, torch.device("cpu"), torch.float32, "packed", 0)
        assert settle_default(*args, small)[0] is config
        assert settle_default(*args, big)[0] == MemoryConfig("direct")
        assert settle_default(*args, big, resident=lambda _: 0.0)[0] is config  # fits, not cached: paged
        asked = (MemoryConfig("paged"), {}, config, "as asked", *args[4:])
        assert settle_default(*asked, big) == (config, "as asked")  # --memory paged: honoured


def test_a_file_out_of_the_page_cache_is_paged(cold):
    every = host_budget_for_slots(cold, cold.hparams.n_experts)
    big = Machine(ram=(64 * every,) * 2, device=(64 * every,) * 2)
    config = MemoryConfig("paged")
    got, why = settle_default(None, {}, config, "", cold, torch.device("cpu"), torch.float32, "packed", 0, big)
    assert got is config and "not in the page cache" in why  # the probe's own answer, not a stand-in's
    _read(cold.path)
    got, why = settle_default(None, {}, config, "", cold, torch.device("cpu"), torch.float32, "packed", 0, big)
    assert got == MemoryConfig("direct") and why.startswith("the file fits in RAM and is in the page cache")


@pytest.mark.parametrize("outtype", [None, "q8_0"])
def test_greedy_tokens_and_logits_are_bit_identical_mapped_or_paged(qwen3, outtype):
    path = qwen3.gguf(outtype)
    _read(path)
    ids = [1, 5, 9, 13, 2, 7, 30, 11]
    seen = {}
    for memory in (None, "paged"):
        with strata.load(path, threads=1, n_ctx=96, max_batch=1, memory=memory) as m:
            done = m.generate(ids, max_tokens=32, temperature=0, stop_token_ids=())
            seen[m.plan.memory] = (done.token_ids, m.logits(ids))
    (direct_tokens, direct_logits), (paged_tokens, paged_logits) = seen["direct"], seen["paged"]
    assert len(direct_tokens) == 32 and direct_tokens == paged_tokens
    assert torch.equal(direct_logits, paged_logits)


def test_generate_stats_show_the_choice(qwen3, capsys):
    from strata.cli import main

    path = qwen3.gguf(None)
    _read(path)
    assert main(["generate", str(path), "-p", "the router", "-n", "3", "--threads", "1", "--stats"]) == 0
    err = capsys.readouterr().err
    plan = next(x for x in err.splitlines() if x.startswith("runtime: "))
    assert "memory: direct — why: " in plan and "memory: the file fits in RAM and is in the page cache" in plan
