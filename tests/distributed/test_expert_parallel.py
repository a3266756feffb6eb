"""Expert parallelism over gloo on loopback, 2 and 3 ranks as subprocesses: the greedy path, a
batch of two prompts and the logits equal one process's (logits within EP_REL_TOL of their range:
the ranks' partial sums are added in rank order, one process adds a token's experts in expert
order); a rank that dies or hangs is an error on rank 0, not a hang; different files are refused."""
from __future__ import annotations

import pytest
import torch

import strata
from tests.fixtures.tiny import zoo

from .ranks import launch, run_ranks, wait_all
from .worker import results

#: max |rank 0's logits - one process's| / max |one process's logits| (float32 rounding of a
#: different summation order, through a few layers).
EP_REL_TOL = 1e-5
CASES = [("qwen3moe", "direct", "float", 2), ("qwen3moe", "direct", "packed", 3), ("qwen3moe", "paged", "packed", 2),
         ("deepseek2", "direct", "float", 3), ("deepseek2", "paged", "packed", 2)]


def single(path, memory: str, compute: str) -> dict:
    with strata.load(path, threads=1, n_ctx=128, max_batch=2, memory=memory, compute=compute) as model:
        return results(model)


@pytest.mark.parametrize("key, memory, compute, world", CASES)
def test_ranks_equal_one_process(key, memory, compute, world, tmp_path):
    path = zoo().get(key).gguf(None)
    ref = single(path, memory, compute)
    ranks = run_ranks(world, path, tmp_path, memory, compute)
    for got in ranks:  # every rank holds the same tokens and logits
        assert got["greedy"] == ref["greedy"]
        assert got["batch"] == ref["batch"]
        logits, expected = torch.tensor(got["logits"]), torch.tensor(ref["logits"])
        assert float((logits - expected).abs().max() / expected.abs().max()) <= EP_REL_TOL
    assert all(r["logits"] == ranks[0]["logits"] for r in ranks[1:])  # bit-equal across ranks
