"""The shard plan: balanced by the file's routing statistics, round-robin without, hottest
experts replicated on request, deterministic, and checksums that tell files and plans apart."""
from __future__ import annotations

import numpy as np
import pytest

from converters import TypePolicy, convert
from strata.distributed.plan import file_checksum, place_layer, shard_plan
from strata.errors import StrataArgumentError
from strata.gguf import open_model
from strata.gguf.routing import save_routing_npz
from strata.synth import build_checkpoint

N_LAYERS, N_EXPERTS = 2, 8


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan")
    hf = build_checkpoint(root / "hf", seed=1, num_hidden_layers=N_LAYERS, num_experts=N_EXPERTS, num_experts_per_tok=2)
    plain = root / "plain.gguf"
    convert(hf, plain, TypePolicy(), n_threads=1)
    counts = np.array([[100, 1, 1, 1, 50, 1, 1, 45], [8, 8, 8, 8, 8, 8, 8, 8]])  # layer 0 skewed
    save_routing_npz(root / "routing.npz", counts, 100)
    seeded = root / "seeded.gguf"
    convert(hf, seeded, TypePolicy(), n_threads=1, routing_stats=root / "routing.npz")
    return plain, seeded


def test_round_robin_without_statistics(files):
    with open_model(files[0]) as mf:
        plan = shard_plan(mf, 3)
    assert not plan.from_stats
    assert plan.experts_of(0) == [[0, 3, 6]] * N_LAYERS
    assert plan.experts_of(2) == [[2, 5]] * N_LAYERS
    assert plan.rank_load(0) == pytest.approx(3 / 8)


def test_statistics_spread_the_hot_experts(files):
    with open_model(files[1]) as mf:
        plan = shard_plan(mf, 2)
    assert plan.from_stats
    # layer 0: 100 on one rank; 50 and 45 together on the other, the cold ones fill the lighter rank
    hot0, hot4, hot7 = (plan.owners[0][e][0] for e in (0, 4, 7))
    assert hot4 == hot7 != hot0
    loads = [sum(w for w, r in zip(plan.load[0], plan.owners[0]) if r == (k,)) for k in range(2)]
    assert abs(loads[0] - loads[1]) < 0.05  # 100+? vs 95+?: within one cold expert's share
    assert sum(len(ids) for ids in plan.experts_of(0)[:1]) + sum(len(ids) for ids in plan.experts_of(1)[:1]) == 8
    # a uniform layer splits evenly
    assert [len(plan.experts_of(r)[1]) for r in range(2)] == [4, 4]
    assert plan.rank_bytes(0) + plan.rank_bytes(1) == 2 * 8 * plan.expert_bytes[0]


def test_replicated_hot_experts_are_on_every_rank(files):
    with open_model(files[1]) as mf:
        plan = shard_plan(mf, 2, replicate_hot=1)
        again = shard_plan(mf, 2, replicate_hot=1)
        single = shard_plan(mf, 2)
    assert plan.owners[0][0] == (0, 1)  # the hottest of layer 0
    assert all(0 in plan.experts_of(r)[0] for r in range(2))
    assert plan == again and plan.checksum() == again.checksum() != single.checksum()
    assert plan.rank_load(0) == pytest.approx(0.5, abs=0.05)


def test_replication_needs_statistics_and_a_sane_count(files):
    with open_model(files[0]) as mf, pytest.raises(StrataArgumentError, match="routing statistics"):
        shard_plan(mf, 2, replicate_hot=1)
    with open_model(files[1]) as mf, pytest.raises(StrataArgumentError, match="expected 0 to 8"):
        shard_plan(mf, 2, replicate_hot=9)


def test_place_layer_is_lpt():
    owners = place_layer(np.array([0.4, 0.3, 0.2, 0.1]), 2)
    assert owners == ((0,), (1,), (1,), (0,))


def test_file_checksum_tells_files_apart(files):
    with open_model(files[0]) as a, open_model(files[1]) as b, open_model(files[0]) as a2:
        assert file_checksum(a) == file_checksum(a2) != file_checksum(b)
        assert len(file_checksum(a)) == 16
