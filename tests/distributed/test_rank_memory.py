"""`--rank-memory R:KEY=VALUE[,...]`: one rank's memory flags under the same torchrun command line;
the override's checks; under 2 ranks given the same flags rank 1's budget is its own and the
tokens are one process's."""
from __future__ import annotations

import argparse

import pytest

from strata.commands.rank_memory import apply, parse
from strata.errors import StrataArgumentError
from tests.fixtures.tiny import zoo

from .ranks import run_ranks
from .test_expert_parallel import single

BASE = dict(memory="paged", device_mem=None, host_mem="8M", prefetch_depth=None, slot_form=None, hybrid=None,
            miss_stand_in=None, stand_in_mode=None)


def _args(*specs: str) -> argparse.Namespace:
    return argparse.Namespace(**BASE, rank_memory=list(specs))


def test_parse():
    assert parse("1:host-mem=48G,prefetch-depth=2") == (1, {"host_mem": "48G", "prefetch_depth": 2})
    assert parse("big-box: memory=tiered, hybrid=on") == ("big-box", {"memory": "tiered", "hybrid": True})


@pytest.mark.parametrize("spec, says", [
    ("1host-mem=8M", "expected R:KEY=VALUE[,KEY=VALUE]"), ("1:", "expected R:KEY=VALUE"),
    ("1:host-mem", "expected KEY=VALUE, found 'host-mem'"), ("1:ram=8M", "unknown key 'ram'; expected one of memory,"),
    ("1:prefetch-depth=two", "prefetch-depth: expected an integer, found 'two'"),
    ("1:hybrid=maybe", "hybrid: expected on or off")])
def test_bad_syntax_is_one_line(spec, says):
    with pytest.raises(StrataArgumentError) as e:
        parse(spec)
    assert str(e.value).startswith(f"--rank-memory {spec!r}: ") and says in str(e.value) and "\n" not in str(e.value)


def test_only_the_matching_rank_changes_and_ranks_win_over_hosts():
    args = _args("1:host-mem=2M", "box:host-mem=4M,memory=paged")
    assert apply(args, 0, 2, host="other") == [] and args.host_mem == "8M"
    args = _args("1:host-mem=2M", "box:host-mem=4M")
    assert apply(args, 0, 2, host="box.example.org") == ["box:host-mem=4M"] and args.host_mem == "4M"
    args = _args("1:host-mem=2M", "box:host-mem=4M")
    assert apply(args, 1, 2, host="box") == ["box:host-mem=4M", "1:host-mem=2M"] and args.host_mem == "2M"


@pytest.mark.parametrize("spec, says", [
    ("2:host-mem=8M", "rank 2 is outside the group (ranks 0 to 1)"),
    ("1:host-mem=lots", "--host-mem: expected a positive number of bytes"),
    ("1:memory=huge", "--memory: expected one of 'tiered', 'paged', 'direct', found 'huge'")])
def test_out_of_range_or_refused_values_on_every_rank(spec, says):
    with pytest.raises(StrataArgumentError) as e:
        apply(_args(spec), 0, 2, host="box")  # rank 0 refuses rank 1's bad value too: no rank joins
    assert str(e.value).startswith(f"--rank-memory {spec!r}: ") and says in str(e.value)


def test_without_expert_parallel_is_one_line(capsys):
    from strata.cli import main

    model = str(zoo().get("qwen3moe").gguf(None))
    capsys.readouterr()
    code = main(["generate", model, "-p", "hi", "--rank-memory", "1:host-mem=8M"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "--rank-memory '1:host-mem=8M': goes with --expert-parallel" in err[0]


def test_rank_1_takes_its_own_host_budget(tmp_path):
    path = zoo().get("qwen3moe").gguf(None)
    ref = single(path, "paged", "packed", host_mem="8M")
    flags = "--memory paged --host-mem 8M --rank-memory 1:host-mem=600K"
    ranks = run_ranks(2, path, tmp_path, flags, "packed", mode="flags")
    assert [r["host_budget"] for r in ranks] == [8 << 20, 600 << 10]
    assert all(r["greedy"] == ref["greedy"] and r["batch"] == ref["batch"] for r in ranks)
