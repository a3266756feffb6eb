"""`strata inspect MODEL --placement --ranks N [--replicate-hot K]`: the shard plan without torchrun,
as text (layers with one split grouped, ids as ranges, replicated experts starred) and as JSON."""
from __future__ import annotations

import json

import pytest

from strata.cli import main
from strata.commands.ranks import id_ranges

from .test_plan import files  # noqa: F401  (the module fixture: a plain file and one with routing statistics)


def test_id_ranges():
    assert id_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert id_ranges([0, 1, 2, 3], {2}) == "0-1,2*,3"
    assert id_ranges([]) == "none"


def test_round_robin_text(files, capsys):  # noqa: F811
    assert main(["inspect", str(files[0]), "--placement", "--ranks", "2"]) == 0
    out = capsys.readouterr().out
    assert "expert parallelism over 2 ranks (round-robin: the file has no routing statistics" in out
    assert "rank 0: expected load 50.0%, 8 experts" in out and "rank 1: expected load 50.0%, 8 experts" in out
    assert "layers 0-1: rank 0: 0,2,4,6; rank 1: 1,3,5,7" in out  # both layers alike: one line


def test_statistics_and_replicas_json(files, capsys):  # noqa: F811
    assert main(["inspect", str(files[1]), "--placement", "--ranks", "2", "--replicate-hot", "1", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)["ranks"]
    assert p["from_stats"] and p["replicate_hot"] == 1 and len(p["plan_checksum"]) == 16
    assert [g["layers"] for g in p["layers"]] == [[0], [1]]  # the skewed layer splits unlike the flat one
    layer0 = p["layers"][0]["experts"]
    assert all("0*" in ids for ids in layer0)  # expert 0, the hottest of layer 0, on both ranks
    assert "4" in layer0[0].split(",") + layer0[1].split(",")  # the next hottest on one rank only
    shares = [r["load_share"] for r in p["per_rank"]]
    assert sum(shares) == pytest.approx(1.0) and abs(shares[0] - shares[1]) < 0.1
    assert sum(r["experts"] for r in p["per_rank"]) == 2 * (8 + 1)  # every expert once, the replicated twice
    assert all(r["expert_bytes"] > 0 for r in p["per_rank"])


def test_replicate_hot_needs_ranks(files, capsys):  # noqa: F811
    assert main(["inspect", str(files[0]), "--placement", "--replicate-hot", "2"]) != 0
    assert "--replicate-hot with --ranks" in capsys.readouterr().err
