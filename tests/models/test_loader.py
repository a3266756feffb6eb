"""Building a model from a file: what is refused, and with which message."""
from __future__ import annotations

import pytest

from strata.errors import StrataError
from strata.gguf import open_model
from strata.memory import DirectExpertMemory
from strata.models import load_model
from tests.gguf import fixtures as gguf_fixtures


def test_unsupported_architecture_names_file_and_supported_ones(tmp_path):
    path = tmp_path / "ds.gguf"
    gguf_fixtures.write_deepseek2(path)
    mf = open_model(path)
    with pytest.raises(StrataError, match=r"ds\.gguf: architecture 'deepseek2' is not supported .*llama, olmoe"):
        load_model(mf, DirectExpertMemory(mf))


def test_quantized_fixture_files_load_and_run(tmp_path):
    """Files in llama.cpp's layout with K-quant and Q8_0 weights of every kind build and run (their
    K-quant experts are random bytes, so only the all-Q8_0 Mixtral file must give finite logits)."""
    import torch

    from strata.engine.kv_cache import KVCache
    from strata.models import Batch

    for writer in (gguf_fixtures.write_mixtral, gguf_fixtures.write_qwen2moe, gguf_fixtures.write_olmoe,
                   gguf_fixtures.write_qwen3moe_fused):
        path = tmp_path / f"{writer.__name__}.gguf"
        writer(path)
        mf = open_model(path)
        hp = mf.hparams
        model = load_model(mf, DirectExpertMemory(mf))
        cache = KVCache(hp.n_layers, 1, 16, hp.n_head_kv, hp.head_dim)
        logits = model(torch.tensor([1, 2, 3]), Batch.make([0], [0], [3]), cache)
        assert logits.shape == (1, hp.vocab_size), writer.__name__
        assert torch.isfinite(logits).all() or writer is not gguf_fixtures.write_mixtral
