"""A layer's routed experts split by `ExpertShard`: every assignment computed by exactly one rank,
each rank acquiring only its experts, and the ranks' partial sums adding up to the whole layer."""
from __future__ import annotations

import pytest
import torch

from strata import native
from strata.gguf import open_model
from strata.memory.parts import file_parts
from strata.memory import DirectExpertMemory
from strata.models.executor import PackedExperts
from strata.models.moe import FloatExperts, RoutedExperts
from strata.models.packed import PackedCompute
from strata.models.shard import ExpertShard
from tests.fixtures.tiny import zoo

OWNERS = [(0,), (1,), (0, 1), (1,), (0,), (1,), (0,), (0, 1)]  # experts 2 and 7 replicated


def test_every_assignment_has_one_rank():
    ids = torch.tensor([[2, 0], [2, 1], [7, 3], [2, 7], [4, 5], [6, 2]])  # [T, K]
    keeps = [ExpertShard(OWNERS, r, lambda x: x).keep(ids) for r in range(2)]
    assert torch.equal(keeps[0] ^ keeps[1], torch.ones_like(keeps[0]))
    rep = ids == 2  # a replicated expert's tokens alternate between the ranks
    assert keeps[0][rep].any() and keeps[1][rep].any()


class Recording(DirectExpertMemory):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = set()

    def start(self, layer, expert_ids):
        self.seen.update(expert_ids)
        return super().start(layer, expert_ids)


@pytest.mark.parametrize("packed", [False, True])
def test_partial_sums_add_up_to_the_layer(packed):
    torch.manual_seed(0)
    with open_model(zoo().get("qwen3moe").gguf(None)) as mf:
        E, D, layer = mf.hparams.n_experts, mf.hparams.n_embd, mf.expert_layers[0]
        owners = [OWNERS[e % len(OWNERS)] for e in range(E)]
        x = torch.randn(7, D)
        weights, ids = torch.rand(7, 2), torch.stack([torch.randperm(E)[:2] for _ in range(7)])
        compute = PackedCompute(1) if packed else None
        if compute is not None:  # the fused call's scratch, as the loader reserves it
            compute.reserve(native.moe_scratch_bytes(file_parts(mf, layer), compute.max_tokens, compute.max_tokens * 2))

        def routed(shard):
            memory = Recording(mf, packed=packed)
            executor = (PackedExperts(memory, layer, E, compute, shard=shard) if packed else
                        FloatExperts(memory, layer, E, shard=shard))
            out = RoutedExperts(executor)(x, weights, ids)
            return out, memory.seen

        whole, _ = routed(None)
        parts = [routed(ExpertShard(owners, r, lambda p: p)) for r in range(2)]
        for r, (_, seen) in enumerate(parts):
            assert seen and all(r in owners[e] for e in seen)
        assert torch.allclose(parts[0][0] + parts[1][0], whole, rtol=1e-5, atol=1e-5 * float(whole.abs().max()))
        if compute is not None:
            compute.close()
