from __future__ import annotations

import pytest
import torch

from tests.fixtures.tiny import ARCH_KEYS, zoo

# Tiny matrices: torch's thread pool only adds barrier waits, which on a shared, loaded machine
# cost more than the maths (benchmarks/RESULTS.md, "Figures behind code comments").
torch.set_num_threads(1)


@pytest.fixture(params=ARCH_KEYS, scope="session")
def tiny(request):
    """One tiny random model per architecture (transformers model, tokenizer, GGUF files)."""
    return zoo().get(request.param)
