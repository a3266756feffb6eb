"""GLM-4.5 (`glm4moe`) on the engine's fast paths: the packed decode steps stay within float
rounding of the float path (its fused decode, program and memories are checked with the other
families' in tests/engine/test_fused_decode.py)."""
from __future__ import annotations

import pytest
import torch

import strata
from tests.fixtures.tiny import zoo
from tests.models.helpers import rel_err

from .test_fused_decode import _decode_logits, _has_program


@pytest.fixture(scope="module")
def glm():
    return zoo().get("glm4moe")


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

