"""Hostile files: every structured malformation and every random mutant of a valid tiny GGUF
ends in a clean run or one `strata: error:` line, never a traceback, signal, timeout or
memory-limit death, for open_model, `strata inspect`, `strata generate` and `strata chat`.

The quick run (default) takes the structured cases and 120 random mutants; the slow one the
structured cases and 2,000 random mutants of another seed.
"""
from __future__ import annotations

import shutil

import pytest

from tests.fixtures.tiny import zoo
from tests.fuzz.cases import build_random, build_structured
from tests.fuzz.harness import run_cases


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The tiny qwen3moe file in its default types (Q8_0 / Q4_K experts) with a chat template."""
    path = tmp_path_factory.mktemp("fuzz-base") / "base.gguf"
    shutil.copyfile(zoo().get("qwen3moe").gguf(None), path)
    return path


def _check(report, min_runs: dict[str, int]) -> None:
    print(report.summary())
    assert report.failures == [], "\n".join(report.failures[:20])
    for command, n in min_runs.items():  # the files did reach each command, and some ran clean
        assert report.verdicts[(command, "ok")] >= n, report.summary()


def test_fuzz_quick(base, tmp_path):
    cases = build_structured(base, tmp_path) + build_random(base, tmp_path, 120, seed=20261130)
    report = run_cases(cases, tmp_path)
    assert report.n_cases >= 300
    _check(report, {"open": 100, "inspect": 50, "generate": 40, "chat": 10})
    errors = {(c, v): n for (c, v), n in report.verdicts.items() if v == "error"}
    assert errors[("open", "error")] >= 100 and errors[("generate", "error")] >= 30 and errors[("chat", "error")] >= 10


@pytest.mark.slow
def test_fuzz_random_2000(base, tmp_path):
    cases = build_structured(base, tmp_path) + build_random(base, tmp_path, 2000, seed=7)
    report = run_cases(cases, tmp_path)
    _check(report, {"open": 600, "inspect": 200, "generate": 200, "chat": 200})
