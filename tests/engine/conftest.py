from __future__ import annotations

import pytest
import torch

import strata
from tests.fixtures.tiny import ARCH_KEYS, zoo

torch.set_num_threads(1)  # tiny matrices: see tests/models/conftest.py


@pytest.fixture(params=ARCH_KEYS, scope="session")
def tiny(request):
    return zoo().get(request.param)


@pytest.fixture(scope="session")
def loaded():
    """`strata.load` of each architecture's f32 file, once per session."""
    models = {}

    def get(key: str) -> strata.engine.Model:
        if key not in models:
            models[key] = strata.load(zoo().get(key).gguf("f32"), threads=1, n_ctx=256)
        return models[key]

    return get
