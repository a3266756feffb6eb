"""`strata bench MODEL` warms up as llama-bench does: an untimed run of the whole prompt and one
decode step before the timed repetitions, reported apart; `--no-warmup` skips it."""
from __future__ import annotations

import json

import pytest

ARGS = ["-p", "24", "-n", "3", "--reps", "2", "--threads", "1", "--memory", "paged"]


def _bench(cli, path, *extra):
    code, out, err = cli("bench", path, *ARGS, *extra)
    assert code == 0, err
    return out


def test_the_warm_up_pages_the_experts_in_before_the_timed_repetitions(cli, qwen3):
    r = json.loads(_bench(cli, qwen3.gguf(None), "--json"))
    warm = r["warmup"]
    assert warm["expert_reads"] > 0 and warm["pp_tok_s"] > 0 and warm["tg_tok_s"] > 0 and warm["batch"] == 1
    assert r["pp_expert_reads"] == [0, 0]  # every timed prefill finds its experts in RAM
    assert len(r["pp_tok_s"]["runs"]) == 2  # the warm-up's rate is not among them


def test_no_warmup_leaves_the_first_repetition_cold(cli, qwen3):
    r = json.loads(_bench(cli, qwen3.gguf(None), "--json", "--no-warmup"))
    assert r["warmup"] is None
    first, second = r["pp_expert_reads"]
    assert first > 0 and second == 0  # the first timed prefill paged the experts in


def test_the_table_shows_the_warm_up_apart(cli, qwen3):
    out = _bench(cli, qwen3.gguf(None))
    line = next(x for x in out.splitlines() if x.startswith("warm-up"))
    assert "untimed and not averaged: pp24" in line and "expert reads" in line
    out = _bench(cli, qwen3.gguf(None), "--no-warmup")
    assert "no warm-up (--no-warmup)" in out


def test_help_lists_no_warmup(capsys):
    from strata.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["bench", "model", "--help"])
    assert exit_.value.code == 0 and "--no-warmup" in capsys.readouterr().out
