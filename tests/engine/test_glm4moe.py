"""GLM-4.5 (`glm4moe`) on the engine's fast paths and memories: the fused decode step and the
decode program give the per-call path's bytes (partial rotary, q/k head norms, q/k/v biases, the
dense first layer, the sigmoid router with its selection bias and scaling, the shared expert),
within float rounding of the float path; paged and tiered memories give direct memory's bytes."""
from __future__ import annotations

import pytest
import torch

import strata
from tests.fixtures.tiny import zoo
from tests.models.helpers import rel_err

from . import test_fused_decode as fused
from .test_fused_decode import _decode_logits, _has_program


@pytest.fixture(scope="module")
def glm():
    return zoo().get("glm4moe")


@pytest.mark.parametrize("outtype", ["q8_0", None], ids=["q8_0", "default"])
def test_glm4moe_fused_decode_and_program_equal_the_per_call_path(glm, outtype):
    fused.test_fused_decode_equals_the_per_call_path(glm, outtype)


def test_glm4moe_program_under_evicting_memory(glm):
    """Fewer slots than experts: hand-backs of MoE layers with missing experts, the dense first
    layer run by the program itself; the per-block path's bytes."""
    fused.test_program_under_evicting_memory_equals_the_per_block_path(glm)


def test_glm4moe_packed_decode_paths_are_within_float_rounding_of_the_float_path(glm):
    """On the f32 file: the program's decode steps (one sequence and three at different
    positions) within 1e-5 of the range of the float path's, the same tokens."""
    prompts_sets = ([glm.prompt_ids(7, seed=1)],
                    [glm.prompt_ids(5, seed=2), glm.prompt_ids(19, seed=3), glm.prompt_ids(11, seed=4)])
    kw = dict(threads=2, n_ctx=128, max_batch=3, memory="direct")
    with strata.load(glm.gguf("f32"), compute="packed", **kw) as packed, \
            strata.load(glm.gguf("f32"), compute="float", **kw) as ref:
        _has_program(glm, packed)
        assert type(packed.transformer.blocks[0].ffn).__name__ == "PackedSharedExpert"  # the dense first layer
        for prompts in prompts_sets:
            for a, b in zip(_decode_logits(packed, prompts), _decode_logits(ref, prompts, "per_call")):
                assert rel_err(a, b) < 1e-5
                assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("memory", ["paged", "tiered"])
def test_glm4moe_memories_equal_direct(glm, memory):
    path, ids = glm.gguf(None), glm.prompt_ids(40)
    prompt = glm.prompt_ids(16, seed=21)
    kw = dict(threads=1, n_ctx=128, max_batch=1, compute="packed")
    with strata.load(path, memory="direct", **kw) as direct, strata.load(path, memory=memory, **kw) as other:
        assert torch.equal(other.logits(ids), direct.logits(ids))
        assert other.generate(prompt, temperature=0, max_tokens=16, stop_token_ids=()).token_ids == \
            direct.generate(prompt, temperature=0, max_tokens=16, stop_token_ids=()).token_ids
