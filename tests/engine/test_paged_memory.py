"""The one-tier paged memory (strata.memory.paged: packed experts read from the file into RAM
slots and computed in place): the logits of direct memory under a budget that evicts, through the
decode program and through the per-block path alike (same hits, misses and evictions), prefill
chunks wider than a layer's slots, start-up placement from the file's routing statistics, and
clear refusals of what it does not serve."""
from __future__ import annotations

import pytest
import torch

import strata
from strata import native
from strata.errors import StrataError
from strata.gguf import open_model
from strata.memory.budget import host_budget_for_slots
from tests.engine.test_fused_decode import program_and_blocks_equal_direct


def _budget(path, slots: int) -> int:
    with open_model(path) as mf:
        return host_budget_for_slots(mf, slots)


def _top_k(path) -> int:
    with open_model(path) as mf:
        return mf.hparams.n_experts_used


def test_paged_memory_equals_direct_under_evictions(tiny):
    path = tiny.gguf(None)
    k = _top_k(path)
    kw = dict(threads=1, n_ctx=128, max_batch=2, memory="paged", host_mem=_budget(path, k + 1))
    prompts = [tiny.prompt_ids(9, seed=21), tiny.prompt_ids(6, seed=22)]
    with strata.load(path, threads=1, n_ctx=128, max_batch=2, memory="direct") as direct, \
            strata.load(path, **kw) as prog, strata.load(path, **kw) as blocks:
        assert prog.memory.max_acquire == k + 1 < prog.memory.n_experts
        a = program_and_blocks_equal_direct(tiny, direct, prog, blocks, prompts,
                                            ("requests", "device_hits", "device_misses", "evictions", "disk_reads",
                                             "bytes_disk"))
        assert a["evictions"] > 0 and a["device_hits"] > 0 and a["bytes_disk"] > 0
        assert a["requests"] == a["device_hits"] + a["device_misses"]


def test_paged_memory_generates_as_direct_with_long_prompts(tiny):
    """A prompt routes to more experts than a layer has slots: acquired in chunks."""
    path = tiny.gguf(None)
    prompt = tiny.prompt_ids(40, seed=23)
    with strata.load(path, threads=2, n_ctx=128, max_batch=1, memory="direct") as direct, \
            strata.load(path, threads=2, n_ctx=128, max_batch=1, memory="paged",
                        host_mem=_budget(path, _top_k(path))) as paged:
        want = direct.generate(prompt, temperature=0, max_tokens=8, stop_token_ids=())
        got = paged.generate(prompt, temperature=0, max_tokens=8, stop_token_ids=())
        assert got.token_ids == want.token_ids
        assert paged.memory._held is None


def test_paged_memory_refuses_what_it_does_not_serve(tiny):
    path = tiny.gguf(None)
    with pytest.raises(StrataError, match="device_mem.*memory='paged'"):
        strata.load(path, threads=1, n_ctx=64, memory="paged", device_mem="64M")
    with pytest.raises(StrataError, match="packed compute"):
        strata.load(path, threads=1, n_ctx=64, memory="paged", compute="float")
    with pytest.raises(StrataError, match="too small"):
        strata.load(path, threads=1, n_ctx=64, memory="paged", host_mem=_budget(path, 1))
    with strata.load(path, threads=1, n_ctx=64, memory="paged") as m:  # default budget: every expert fits here
        assert m.memory.max_acquire == m.memory.n_experts
        assert m.memory.form == "packed"  # it hands out packed experts only


def test_paged_acquire_in_two_halves_and_abandoned(tiny):
    """start pins the experts in RAM and queues the reads of the others (-1 in the index);
    finish waits for them; a release between the halves finishes the reads and leaves no
    slot pinned or loading."""
    from strata.memory.policy import READY

    path = tiny.gguf(None)
    k = _top_k(path)
    with strata.load(path, threads=1, n_ctx=64, memory="paged", host_mem=_budget(path, k)) as m:
        mem, layer = m.memory, m.memory.layers.layer(0)
        first = list(range(k))
        mem.acquire(layer, first)
        mem.release(layer, first)
        second = list(range(1, k + 1))  # one expert new: read; the others pinned at once
        held = mem.start(layer, second)
        assert held.index[-1] == -1 and min(held.index[:-1]) >= 0
        done = mem.finish(layer, second)
        assert min(done.index) >= 0 and done.index[:-1] == held.index[:-1]
        mem.release(layer, second)
        third = [k + 1, k + 2] if mem.n_experts > k + 2 else [k + 1]
        assert min(mem.start(layer, third).index) == -1
        mem.release(layer, third)  # abandoned between the halves
        policy = mem.host.policy
        assert not policy.slot_pins.any() and (policy.slot_state[policy.slot_expert >= 0] == READY).all()
        with pytest.raises(RuntimeError, match="without its start"):
            mem.finish(layer, third)
        assert min(mem.acquire(layer, first).index) >= 0
        mem.release(layer, first)


def test_a_steps_reports_in_one_call_count_what_per_layer_reports_count(tiny):
    """The decode program reports a token's layers with served_fixed_layers: the same use counts
    (to the bit), routing statistics, hits and requests as one served_fixed per layer."""
    import numpy as np

    path = tiny.gguf(None)
    kw = dict(threads=1, n_ctx=64, memory="paged", host_mem=_budget(path, _top_k(path)))
    with strata.load(path, **kw) as one, strata.load(path, **kw) as each:
        layers = list(one.memory.layers)
        g = torch.Generator().manual_seed(3)
        for T in (1, 3, 1):
            ids = torch.stack([torch.randperm(one.memory.n_experts, generator=g)[:_top_k(path)] for _ in
                               range(len(layers) * T)]).view(len(layers), T, -1)
            used = [len(set(x.flatten().tolist())) for x in ids]
            one.memory.served_fixed_layers(layers, ids, used)
            for i, layer in enumerate(layers):
                each.memory.served_fixed(layer, ids[i], used[i])
        a, b = one.memory.host.policy, each.memory.host.policy
        assert np.array_equal(a._counts, b._counts) and np.array_equal(a._steps, b._steps)
        for key in ("routing_counts", "routing_tokens", "device_hits", "requests"):
            assert np.array_equal(getattr(one.memory.stats, key), getattr(each.memory.stats, key)), key
        assert one.memory.stats.routing_tokens.tolist() == [5] * len(layers)
        with pytest.raises(StrataError, match="distinct layers"):
            a.record_layers(np.array([0, 0]), ids[:1].repeat(2, 1, 1).numpy())


def test_a_budget_for_every_expert_reads_through_the_page_cache(tiny):
    """Nothing is ever evicted, so reads go through the page cache (a cached file is copied, not
    read from the disk again); a smaller budget keeps the pager's own choice (O_DIRECT where the
    file system allows it)."""
    path = tiny.gguf(None)
    with open_model(path) as mf:
        every = host_budget_for_slots(mf, mf.hparams.n_experts)
    with strata.load(path, threads=1, n_ctx=64, memory="paged", host_mem=every) as whole, \
            strata.load(path, threads=1, n_ctx=64, memory="paged", host_mem=_budget(path, _top_k(path))) as part, \
            strata.load(path, threads=1, n_ctx=64, memory="direct") as direct:
        assert whole.memory.max_acquire == whole.memory.n_experts and not whole.memory.host.pager.info.direct
        with open_model(path) as mf, native.Pager(mf.path, 1) as probe:
            assert part.memory.host.pager.info.direct == probe.info.direct
        ids = tiny.prompt_ids(12, seed=5)
        assert torch.equal(whole.logits(ids), direct.logits(ids))
        assert whole.memory_stats().totals()["bytes_disk"] > 0



def test_a_step_wider_than_a_window_reads_as_steps_of_a_window_would(tiny):
    """Packed compute takes a layer's experts over DEFAULT_MAX_TOKENS tokens per window, each
    window acquiring what it routes to. A 1100-token prompt in one step of 2048 (three windows)
    reads from the file exactly what it reads in steps of 512: with 2 slots per layer for 4
    experts, every expert of every layer once per window."""
    from strata.models.packed import DEFAULT_MAX_TOKENS
    path = tiny.gguf(None)
    with open_model(path) as mf:
        n_layers, n_experts, vocab = len(mf.expert_layers), mf.hparams.n_experts, mf.hparams.vocab_size
    prompt = [(i * 37 + 11) % vocab for i in range(1100)]
    reads = []
    for step in (2048, DEFAULT_MAX_TOKENS):
        with strata.load(path, threads=1, n_ctx=1104, max_batch=1, memory="paged", host_mem=_budget(path, 2),
                         max_step_tokens=step) as m:
            m.generate(prompt, temperature=0, max_tokens=1, stop_token_ids=())
            reads.append(m.memory_stats().totals()["disk_reads"])
    assert n_experts > 2 and reads == [3 * n_layers * n_experts] * 2
