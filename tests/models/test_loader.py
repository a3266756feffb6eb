"""Building a model from a file: what is refused, and with which message."""
from __future__ import annotations

import pytest

from strata.errors import StrataError
from strata.gguf import open_model
from strata.memory import DirectExpertMemory
from strata.models import load_model
from tests.gguf import fixtures as gguf_fixtures


def test_unsupported_architecture_names_file_and_supported_ones(tmp_path):
    """An architecture Strata reads but does not run (its record says runs=False)."""
    import dataclasses

    from strata import arch
    path = tmp_path / "ds.gguf"
    gguf_fixtures.write_deepseek2(path)
    mf = open_model(path)
    record = arch.get("deepseek2")
    arch.unregister("deepseek2")
    arch.register(dataclasses.replace(record, runs=False))
    try:
        with pytest.raises(StrataError, match=r"ds\.gguf: architecture 'deepseek2' is not supported .*llama, llama4, "
                                              r".*minimax-m2, olmoe"):
            load_model(mf, DirectExpertMemory(mf))
    finally:
        arch.unregister("deepseek2")
        arch.register(record)


@pytest.mark.parametrize("writer", ["write_deepseek2", "write_gpt_oss"])
def test_deepseek2_and_gpt_oss_fixture_files_build_and_run(tmp_path, writer):
    """llama.cpp-layout files: deepseek2 in the older kv_b form (split at load), gpt-oss with MXFP4
    experts and expert biases; float and packed compute build them and run a prefill."""
    import torch

    from strata.engine.kv_cache import KVCache
    from strata.models import cache_dims

    path = tmp_path / "m.gguf"
    getattr(gguf_fixtures, writer)(path)
    mf = open_model(path)
    hp = mf.hparams
    for compute in ("float", "packed"):
        memory = DirectExpertMemory(mf, packed=compute == "packed")
        model = load_model(mf, memory, compute=compute)
        cache = KVCache(hp.n_layers, 1, 16, *cache_dims(hp))
        logits = model(torch.arange(5), cache.batch([cache.allocate()], [0], [5]), cache, True)
        assert logits.shape == (5, hp.vocab_size)


def test_quantized_fixture_files_load_and_run(tmp_path):
    """Files in llama.cpp's layout with K-quant and Q8_0 weights of every kind build and run (their
    K-quant experts are random bytes, so only the all-Q8_0 Mixtral file must give finite logits)."""
    import torch

    from strata.engine.kv_cache import KVCache

    for writer in (gguf_fixtures.write_mixtral, gguf_fixtures.write_qwen2moe, gguf_fixtures.write_olmoe,
                   gguf_fixtures.write_qwen3moe_fused):
        path = tmp_path / f"{writer.__name__}.gguf"
        writer(path)
        mf = open_model(path)
        hp = mf.hparams
        model = load_model(mf, DirectExpertMemory(mf))
        cache = KVCache(hp.n_layers, 1, 16, hp.n_head_kv, hp.head_dim)
        logits = model(torch.tensor([1, 2, 3]), cache.batch([cache.allocate()], [0], [3]), cache)
        assert logits.shape == (1, hp.vocab_size), writer.__name__
        assert torch.isfinite(logits).all() or writer is not gguf_fixtures.write_mixtral
