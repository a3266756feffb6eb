"""The tiered expert memory on a CUDA device (marked `cuda`, skipped without a GPU): at 4x/2x
pressure the logits and greedy tokens equal the all-resident CUDA run for both slot forms, with
prefetch off and on, in float32 and bfloat16; after start-up, decoding takes no new device
memory from the driver and no pinned host memory."""
from __future__ import annotations

import pytest
import torch

import strata
from strata.memory.alloc import ALLOCATIONS

from .tiered_fixture import DEVICE_SLOTS, FORMS, GREEDY, HOST_SLOTS, moe_file, prompt, tiered

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def path():
    return moe_file()


@pytest.fixture(scope="module")
def reference(path):
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        with strata.load(path, device="cuda", dtype=dtype, memory="direct", n_ctx=256) as m:
            ids = prompt(24)
            out[dtype] = (m.logits(ids), m.generate(ids, max_tokens=32, **GREEDY).token_ids,
                          [c.token_ids for c in m.generate_batch([prompt(5, 1), prompt(17, 2)], max_tokens=12,
                                                                  **GREEDY)])
    return out


def load(path, form, depth, dtype=torch.float32):
    return strata.load(path, device="cuda", dtype=dtype, n_ctx=256,
                       memory=tiered(path, form, depth, dtype=dtype, device="cuda"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("depth", [0, 2], ids=lambda d: f"prefetch{d}")
@pytest.mark.parametrize("form", FORMS)
def test_cuda_logits_and_tokens_equal_the_all_resident_run(path, reference, form, depth, dtype):
    logits, greedy, batch = reference[dtype]
    with load(path, form, depth, dtype) as m:
        mem = m.memory
        assert mem.slots.cuda and mem.host.pinned  # the page table has no device copy: nothing there reads it
        assert (mem.plan.slots_per_layer, mem.host.slots_per_layer) == (DEVICE_SLOTS, HOST_SLOTS)
        assert torch.equal(m.logits(prompt(24)), logits)
        assert m.generate(prompt(24), max_tokens=32, **GREEDY).token_ids == greedy
        assert [c.token_ids for c in m.generate_batch([prompt(5, 1), prompt(17, 2)], max_tokens=12,
                                                      **GREEDY)] == batch
        t = m.memory_stats().totals()
        assert t["disk_reads"] + t["prefetch_disk_reads"] > 0 and t["evictions"] > 0
        mem.close()
        torch.cuda.synchronize()
        assert torch.equal(mem.page_table.cpu(), torch.from_numpy(mem.policy.page_table))


def _cuda_counters() -> dict[str, int]:
    s = torch.cuda.memory_stats()
    out = {"segments": s["segment.all.allocated"], "reserved": s["reserved_bytes.all.current"]}
    if hasattr(torch.cuda, "host_memory_stats"):
        h = torch.cuda.host_memory_stats()
        out.update(pinned_allocs=h.get("num_host_alloc", 0), pinned_bytes=h.get("allocated_bytes.current", 0))
    return out


@pytest.mark.parametrize("form", FORMS)
def test_cuda_decoding_allocates_nothing_after_start_up(path, form):
    with load(path, form, depth=2) as m:
        m.generate(prompt(8, 4), max_tokens=64, **GREEDY)  # warm-up: kernels, allocator blocks
        torch.cuda.synchronize()
        before, ours = _cuda_counters(), ALLOCATIONS.snapshot()
        done = m.generate(prompt(8, 5), max_tokens=64, **GREEDY)
        torch.cuda.synchronize()
        assert len(done.token_ids) == 64
        # activations come from the caching allocator's blocks; no new device memory is taken
        # from the driver, no pinned host memory is allocated, no memory-system buffer is made
        assert _cuda_counters() == before
        assert ALLOCATIONS.snapshot() == ours
        assert m.memory_stats().total("disk_reads") + m.memory_stats().total("prefetch_disk_reads") > 0
