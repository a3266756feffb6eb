"""Hunyuan V3 (`hy_v3`) on the engine's fast paths and memories: the fused decode step and the
decode program give the per-call path's bytes (q/k head norms, the dense first layer, the sigmoid
router with its selection bias and scale, the shared expert), also when the program hands layers
to an evicting memory; paged and tiered memories give direct memory's bytes."""
from __future__ import annotations

import pytest
import torch

import strata
from tests.fixtures.tiny import zoo

from . import test_fused_decode as fused


@pytest.fixture(scope="module")
def hy():
    return zoo().get("hyv3")


@pytest.mark.parametrize("outtype", ["q8_0", None], ids=["q8_0", "default"])
def test_hy_v3_fused_decode_and_program_equal_the_per_call_path(hy, outtype):
    fused.test_fused_decode_equals_the_per_call_path(hy, outtype)


def test_hy_v3_program_hands_layers_to_the_memory(hy):
    fused.test_program_hands_layers_with_missing_experts_to_the_memory(hy)


def test_hy_v3_program_under_evicting_memory(hy):
    fused.test_program_under_evicting_memory_equals_the_per_block_path(hy)


@pytest.mark.parametrize("memory", ["paged", "tiered"])
def test_hy_v3_memories_equal_direct(hy, memory):
    path, ids = hy.gguf(None), hy.prompt_ids(40)
    prompt = hy.prompt_ids(16, seed=21)
    kw = dict(threads=1, n_ctx=128, max_batch=1, compute="packed")
    with strata.load(path, memory="direct", **kw) as direct, strata.load(path, memory=memory, **kw) as other:
        assert torch.equal(other.logits(ids), direct.logits(ids))
        assert other.generate(prompt, temperature=0, max_tokens=16, stop_token_ids=()).token_ids == \
            direct.generate(prompt, temperature=0, max_tokens=16, stop_token_ids=()).token_ids
