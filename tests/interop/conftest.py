from __future__ import annotations

import pytest

from tests.interop.quantize_fixtures import LlamaQuantized


@pytest.fixture(scope="session")
def quantized(tmp_path_factory) -> LlamaQuantized:
    """The fixture model and its files quantized by llama.cpp's own quantizer, each made once a session."""
    pytest.importorskip("llama_cpp")
    return LlamaQuantized(tmp_path_factory.mktemp("llama-quantized"))
