"""The fused decode step of packed compute (strata.models.step: a layer's attention half and
router in one native call, its routed experts in the fused MoE call) gives exactly the bytes of
the per-call path it replaces, on every architecture's fixture, for one sequence and for a batch
of sequences at different positions; and its native entry point refuses bad arguments.
"""
from __future__ import annotations

import pytest
import torch

import strata
from strata import native
from strata.errors import NativeError

STEPS = 12


def _decode_logits(model, prompts: list[list[int]], fused: bool) -> list[torch.Tensor]:
    """Prefill each prompt in its own slot, then STEPS batched greedy decode steps: the logits
    [B, V] of every step."""
    t = model.transformer
    saved = [b.fused for b in t.blocks]
    if not fused:
        for b in t.blocks:
            b.fused = None
    slots = [model.cache.allocate() for _ in prompts]
    try:
        last = []
        for slot, ids in zip(slots, prompts):
            batch = model.cache.batch([slot], [0], [len(ids)])
            last.append(int(t(torch.tensor(ids), batch, model.cache)[0].argmax()))
        starts, out = [len(p) for p in prompts], []
        for _ in range(STEPS):
            batch = model.cache.batch(slots, starts, [1] * len(slots))
            logits = t(torch.tensor(last), batch, model.cache)  # [B, V]
            out.append(logits.clone())
            last, starts = logits.argmax(-1).tolist(), [s + 1 for s in starts]
        return out
    finally:
        for s in slots:
            model.cache.free(s)
        for b, f in zip(t.blocks, saved):
            b.fused = f


@pytest.mark.parametrize("outtype", ["q8_0", None], ids=["q8_0", "default"])
def test_fused_decode_equals_the_per_call_path(tiny, outtype):
    with strata.load(tiny.gguf(outtype), threads=2, n_ctx=128, max_batch=3, compute="packed",
                     memory="direct") as m:
        assert all(b.fused is not None for b in m.transformer.blocks)
        for prompts in ([tiny.prompt_ids(7, seed=1)],
                        [tiny.prompt_ids(5, seed=2), tiny.prompt_ids(19, seed=3), tiny.prompt_ids(11, seed=4)]):
            fused, per_call = _decode_logits(m, prompts, True), _decode_logits(m, prompts, False)
            for a, b in zip(fused, per_call):
                assert torch.equal(a, b)


def test_fused_decode_under_tiered_memory_equals_direct(tiny):
    path = tiny.gguf(None)
    prompts = [tiny.prompt_ids(9, seed=5), tiny.prompt_ids(4, seed=6)]
    with strata.load(path, threads=1, n_ctx=128, max_batch=2, compute="packed", memory="direct") as direct, \
            strata.load(path, threads=1, n_ctx=128, max_batch=2, compute="packed", memory="tiered") as tiered:
        assert all(b.fused is not None for b in tiered.transformer.blocks)
        for a, b in zip(_decode_logits(direct, prompts, True), _decode_logits(tiered, prompts, True)):
            assert torch.equal(a, b)


def test_float_compute_has_no_fused_step(tiny):
    with strata.load(tiny.gguf("q8_0"), threads=1, n_ctx=64, compute="float") as m:
        assert all(b.fused is None for b in m.transformer.blocks)


def test_native_step_refuses_bad_arguments(tiny):
    with strata.load(tiny.gguf("q8_0"), threads=1, n_ctx=64, max_batch=1, compute="packed",
                     memory="direct") as m:
        step = m.transformer.blocks[0].fused
        layer, c = step.layer, m.transformer.compute
        x = torch.zeros((1, layer.n_embd))
        cos, sin = m.transformer.rope.cos_sin(torch.tensor([0]), torch.float32)
        fresh = native.DecodeAttn.__new__(native.DecodeAttn)
        fresh.__dict__.update(layer.__dict__, _cache=None)
        with pytest.raises(ValueError, match="bind_cache"):
            fresh.run(c.pool, torch.tensor([[0]]), torch.tensor([0]), cos, sin, x, step.out, c.scratch)
        layer.bind_cache(*m.cache.layer(0))
        assert m.cache.n_blocks == 4  # 64 positions in blocks of 16
        with pytest.raises(NativeError, match="decode step of 1 sequences"):  # position past the table
            layer.run(c.pool, torch.tensor([[0, 1]]), torch.tensor([32]), cos, sin, x, step.out, c.scratch)
        with pytest.raises(NativeError):  # the new token's block past the pool
            layer.run(c.pool, torch.tensor([[0, 4]]), torch.tensor([20]), cos, sin, x, step.out, c.scratch)
        before = m.cache.k[0].clone()
        with pytest.raises(NativeError):  # an earlier block past the pool (read by attention)
            layer.run(c.pool, torch.tensor([[-1, 0]]), torch.tensor([20]), cos, sin, x, step.out, c.scratch)
        assert torch.equal(m.cache.k[0], before)  # checked before the new token's keys were written
        with pytest.raises(ValueError, match="int64"):
            layer.run(c.pool, torch.tensor([[0]], dtype=torch.int32), torch.tensor([0]), cos, sin, x, step.out,
                      c.scratch)
        with pytest.raises(ValueError, match="block_table"):  # one table row per sequence
            layer.run(c.pool, torch.tensor([0]), torch.tensor([0]), cos, sin, x, step.out, c.scratch)
        with pytest.raises(ValueError, match="must be"):  # caches of the wrong shape
            layer.bind_cache(torch.zeros((1, 1, 8, 3)), torch.zeros((1, 1, 8, 3)))
        with pytest.raises(NativeError):  # scratch too small
            layer.run(c.pool, torch.tensor([[0]]), torch.tensor([0]), cos, sin, x, step.out,
                      torch.zeros(8, dtype=torch.uint8))
