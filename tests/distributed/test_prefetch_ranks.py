"""Look-ahead prefetch on a rank of an expert-parallel group (tiered memory, prefetch depth 1,
float compute, 2 ranks): the rank's memory is never asked to prefetch, and never reads, an expert
another rank owns; prefetch still runs, and the tokens are one process's."""
from __future__ import annotations

from tests.fixtures.tiny import zoo

from .ranks import run_ranks
from .test_expert_parallel import single

MEMORY = "tiered:prefetch_depth=1"


def test_a_rank_prefetches_and_reads_only_its_experts(tmp_path):
    path = zoo().get("qwen3moe").gguf(None)
    ref = single(path, "tiered", "float", prefetch_depth=1)
    ranks = run_ranks(2, path, tmp_path, MEMORY, "float", mode="loads")
    for rank, got in enumerate(ranks):
        owned = {tuple(x) for x in got["owned"]}
        prefetches, loads = [tuple(x) for x in got["prefetches"]], [tuple(x) for x in got["loads"]]
        unowned = (sum(x not in owned for x in prefetches), sum(x not in owned for x in loads))
        assert unowned == (0, 0), f"rank {rank}: {unowned[0]} prefetches and {unowned[1]} reads of others' experts"
        assert prefetches and loads, f"rank {rank}: no prefetch ran"
        assert got["greedy"] == ref["greedy"] and got["batch"] == ref["batch"]


def test_a_restricted_memory_drops_predictions_of_unowned_experts():
    """The memory's own predictors (co-occurrence) announce through the same filter."""
    import numpy as np

    import strata
    from strata.memory.predict import Prediction

    with strata.load(zoo().get("qwen3moe").gguf(None), threads=1, memory="tiered", compute="float",
                     prefetch_depth=1) as model:
        memory, layer = model.memory, model.model_file.expert_layers[0]
        E = model.model_file.hparams.n_experts
        memory.restrict({layer: np.arange(E) % 2 == 0})  # this rank: the even experts
        memory.loads.announce(Prediction(0, np.arange(1, E, 2), np.ones(E // 2)))
        assert not memory.loads.predicted[0].any() and memory.memory_stats().totals()["prefetch_issued"] == 0
        memory.loads.announce(Prediction(0, np.arange(E), np.ones(E)))
        assert memory.loads.predicted[0].tolist() == [e % 2 == 0 for e in range(E)]
