"""The same engine on a CUDA device: f32 equals transformers and the CPU run; bf16 tracks f32.

Marked `cuda`; skipped where torch sees no GPU.
"""
from __future__ import annotations

import pytest
import torch

import strata
from strata.gguf import open_model
from strata.memory import DirectExpertMemory

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def on_gpu():
    models = {}

    def get(tiny, dtype: str) -> strata.engine.Model:
        if (tiny.key, dtype) not in models:
            models[tiny.key, dtype] = strata.load(tiny.gguf("f32"), device="cuda", dtype=dtype, n_ctx=256)
        return models[tiny.key, dtype]

    return get


def test_f32_logits_on_cuda_equal_transformers(tiny, on_gpu):
    m = on_gpu(tiny, "float32")
    assert m.transformer.embedding.is_cuda and m.cache.k[0].is_cuda
    ids = tiny.prompt_ids(20)
    ref = tiny.hf_logits(ids)
    assert float((m.logits(ids) - ref).abs().max() / ref.abs().max()) <= 1e-4


def test_f32_greedy_on_cuda_equals_cpu_and_batches_equal_alone(tiny, on_gpu, loaded):
    gpu, cpu = on_gpu(tiny, "float32"), loaded(tiny.key)
    prompts = [tiny.prompt_ids(n, seed=n) for n in (5, 23, 11, 16)]
    alone = [gpu.generate(p, temperature=0, max_tokens=32, stop_token_ids=()).token_ids for p in prompts]
    assert [c.token_ids for c in gpu.generate_batch(prompts, temperature=0, max_tokens=32, stop_token_ids=())] == alone
    assert alone[1] == cpu.generate(prompts[1], temperature=0, max_tokens=32, stop_token_ids=()).token_ids


def test_bf16_on_cuda_tracks_f32(tiny, on_gpu):
    bf16, f32 = on_gpu(tiny, "bfloat16"), on_gpu(tiny, "float32")
    assert bf16.dtype == torch.bfloat16 and strata.load(tiny.gguf("f32"), device="cuda").dtype == torch.bfloat16
    ids = tiny.prompt_ids(96)
    a, b = bf16.logits(ids), f32.logits(ids)
    assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.9
    stream = bf16.generate(ids[:16], temperature=0, max_tokens=16, stream=True, stop_token_ids=())
    assert len([c for c in stream]) == 16 and stream.completion.tokens_per_second > 0


def test_direct_memory_copies_experts_to_the_device(tiny):
    mf = open_model(tiny.gguf("f32"))
    gpu = DirectExpertMemory(mf, device="cuda", dtype=torch.float32, max_acquire=2)
    cpu = DirectExpertMemory(mf, device="cpu", dtype=torch.float32, max_acquire=2)
    layer = mf.expert_layers[-1]
    for g, c in zip(gpu.acquire(layer, [1, 0]), cpu.acquire(layer, [1, 0])):
        assert g.gate.is_cuda and torch.equal(g.gate.cpu(), c.gate) and torch.equal(g.down.cpu(), c.down)
    gpu.release(layer, [1, 0])
    cpu.release(layer, [1, 0])
