"""Hybrid compute on a CUDA device (marked `cuda`, skipped without a GPU): at the acceptance
pressure (experts 4x the device slots, 2x the host tier), with every eligible miss sent to the CPU
(frozen rates), logits stay close to the device-only run (top-1 >= 0.99 at clear winners, bounds
in test_hybrid_exec.py), experts really are computed on the CPU from the pinned host pool, fewer
bytes cross to the device, and after warm-up decoding makes no memory-system buffer, takes no
device memory from the driver and allocates no pinned host memory."""
from __future__ import annotations

import pytest
import torch

from tests.runtime.test_hybrid_exec import check_hybrid_against_device_only
from tests.memory.test_tiered_cuda import _cuda_counters
from tests.memory.tiered_fixture import moe_file, prompt, tiered

import strata
from strata.runtime.hybrid import HybridRates
from strata.runtime.hybrid import layer_format

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def path():
    return moe_file()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("form", ["dequantized", "packed"])
def test_cuda_hybrid_is_close_computes_on_the_cpu_and_copies_less(path, form, dtype):
    check_hybrid_against_device_only(path, form, "cuda", dtype)


def test_cuda_hybrid_decoding_allocates_nothing_after_start_up(path):
    # prefetch off: an expert a prefetch is bringing to the device is not a CPU candidate, and
    # at depth 2 the loader reaches nearly every miss first (seen on an H200: no CPU computes)
    factory = tiered(path, "packed", 0, device="cuda", hybrid=True)
    with strata.load(path, device="cuda", n_ctx=256, memory=factory) as m:
        ex = m.runner.hybrid.exec
        assert m.memory.host.pinned and m.memory.host.compact
        ex.rates, ex.learn = HybridRates({layer_format(m.model_file, layer)[0]: 1e15 for layer in
                                          m.model_file.expert_layers}, copy_bytes_per_s=1e6), False
        m.generate(prompt(8, 4), temperature=0, max_tokens=32, stop_token_ids=())  # warm-up
        torch.cuda.synchronize()
        before = _cuda_counters()
        m.generate(prompt(8, 5), temperature=0, max_tokens=32, stop_token_ids=())
        torch.cuda.synchronize()
        assert _cuda_counters() == before
        assert m.memory_stats().total("cpu_computed") > 0


def test_cuda_hybrid_measures_its_rates(path):
    with strata.load(path, device="cuda", n_ctx=256, memory=tiered(path, "packed", 0, device="cuda",
                                                                     hybrid=True)) as m:
        m.generate(prompt(24), temperature=0, max_tokens=32, stop_token_ids=())
        r, fmt = m.runner.hybrid.exec.rates, layer_format(m.model_file, m.model_file.expert_layers[0])[0]
        assert r.cpu_token_bytes_per_s[fmt] > 0 and r.copy_bytes_per_s > 0
