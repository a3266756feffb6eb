"""A tiered memory whose device holds a slot for every expert, with no loader thread, is settled:
a loaded expert never moves, so steps take their hits without pins and skip the eviction policy's
use counts; results, hits and routing statistics are those of the pinned path. (The tiered memory
hands out float weights: float compute; with packed compute the paged memory serves the CPU.)"""
from __future__ import annotations

import numpy as np
import torch

import strata

from .tiered_fixture import N_EXPERTS, moe_file, prompt, tiered


def test_settled_memory_decodes_like_the_pinned_path():
    path = moe_file()
    kw = dict(threads=1, n_ctx=128, max_batch=1, compute="float")
    with strata.load(path, prefetch_depth=0, **kw) as settled, strata.load(path, memory="direct", **kw) as direct, \
            strata.load(path, memory=tiered(path, "packed", 0), **kw) as pressed:
        mem = settled.memory
        assert mem._settled and mem.plan.slots_per_layer == N_EXPERTS and not pressed.memory._settled
        ids = prompt(12)
        out = settled.generate(ids, temperature=0, max_tokens=24, stop_token_ids=())
        assert out.token_ids == direct.generate(ids, temperature=0, max_tokens=24, stop_token_ids=()).token_ids
        assert out.token_ids == pressed.generate(ids, temperature=0, max_tokens=24, stop_token_ids=()).token_ids
        assert not mem.policy.slot_pins.any()  # nothing left pinned, and nothing was needed
        table = mem.policy.page_table.copy()
        again = settled.generate(ids, temperature=0, max_tokens=24, stop_token_ids=())
        assert again.token_ids == out.token_ids and np.array_equal(mem.policy.page_table, table)
        t = settled.memory_stats().totals()
        assert t["requests"] == t["device_hits"] + t["device_misses"] + t["device_late"] > 0
        counts, tokens = settled.memory_stats().routing()
        assert tokens > 0 and (counts.sum(axis=1) == tokens * settled.model_file.hparams.n_experts_used).all()
        assert torch.equal(settled.logits(ids), direct.logits(ids))
