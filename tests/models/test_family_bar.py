"""The bar every family since the first four (tests/models/test_logits.py) meets against
transformers' own class, once over each one's tiny model: the f32 file prefilled and then decoded
a token at a time within REL_TOL of transformers' logits at every step, transformers' 32 greedy
tokens, a batch of two equal to each sequence alone, a prompt in chunks equal to transformers
(the state carried between chunks: a recurrent layer's conv state, cached keys a later chunk's
choice scores), and the engine's continuous batching equal to each prompt alone. What only a
family has is in its own module (test_new_archs.py, test_llama4.py, test_qwen3next.py, ...)."""
from __future__ import annotations

import pytest

from tests.fixtures.tiny import GGUF_ARCH, zoo

from .helpers import (check_batch_of_two, check_chunked_prefill, check_generate_batch, check_greedy_32,
                      check_prefill_and_decode)

FAMILIES = ("deepseek3", "deepseek2", "gptoss", "glm4moe", "minimax", "llama4", "qwen3next", "qwen35moe", "mimo2",
            "hyv3", "deepseek32", "glmdsa")  # deepseek2: DeepSeek-V2; glmdsa: GLM-5


@pytest.fixture(params=FAMILIES, scope="module")
def family(request):
    return zoo().get(request.param)


def test_prefill_and_each_decode_step_match_transformers(family, record_property):
    check_prefill_and_decode(family, record_property, GGUF_ARCH[family.key], 20, 16)


def test_greedy_32_tokens_match_transformers(family):
    check_greedy_32(family)


def test_a_batch_of_two_equals_each_alone(family):
    check_batch_of_two(family)


def test_chunked_prefill_carries_the_state(family):
    check_chunked_prefill(family)


def test_generate_batch_equals_each_alone(family):
    check_generate_batch(family)
