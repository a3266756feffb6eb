"""`bench`, `bench ladder` and `bench tiered` show a progress bar on a terminal's stderr (tqdm),
and nothing but the result where stderr is not a terminal or with --json; the ladder explains
rows slower than naive, names the memory its runtime plan ran, and its deliberately small top-k
row does not warn about budgets nobody asked for."""
from __future__ import annotations

import json
import subprocess
import warnings

import pytest

from strata.bench.ladder import MEASURES, ROWS, bench_ladder
from strata.commands.bench import format_ladder
from strata.errors import SlowPathWarning

from .pty_run import run_with_tty_stderr

LADDER = ["-n", "3", "--batch", "2", "--threads", "1"]


@pytest.mark.parametrize("cmd", [["ladder", *LADDER],
                                 ["tiered", "--tokens", "3", "--depths", "0", "1", "--threads", "1", "--ctx", "32"],
                                 ["model", "-p", "4", "-n", "3", "--reps", "2", "--threads", "1"]])
def test_progress_bar_on_a_terminal_only(qwen3, python, subprocess_env, cmd):
    argv = [python, "-m", "strata", "bench", cmd[0], str(qwen3.gguf(None)), *cmd[1:]]
    code, out, tty = run_with_tty_stderr(argv, subprocess_env)
    assert code == 0, tty
    assert "%|" in tty and "run/s" in tty or "s/run" in tty  # tqdm's bar and rate, on the terminal
    assert "%|" not in out and "tok/s" in out  # stdout: the table alone
    piped = subprocess.run([*argv, "--json"], capture_output=True, text=True, env=subprocess_env, timeout=300)
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    json.loads(piped.stdout)
    code, out, tty = run_with_tty_stderr([*argv, "--json"], subprocess_env)
    assert code == 0 and "%|" not in tty  # --json: no bar even on a terminal
    json.loads(out)


def test_ladder_rows_name_the_plans_memory_and_no_warning_from_the_top_k_row(qwen3, monkeypatch):
    monkeypatch.setattr("strata.memory.placement.SLOW_PATH_SHARE", -1.0)  # every budget "too small"

    def no_probe(*a, **kw):
        raise OSError("not measured here")

    monkeypatch.setattr("strata.memory.placement.sequential_direct_rate", no_probe)
    seen = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = bench_ladder(str(qwen3.gguf(None)), gen=3, batch=2, threads=1,
                         on_row=lambda done, total, name: seen.append((done, total, name)))
    slow = [w for w in caught if issubclass(w.category, SlowPathWarning)]
    assert len(slow) == 2  # the caching rows, whose budgets are the user's (the machine's here); not "+ prefetch"
    assert seen == [(i + 1, len(ROWS), name) for i, name in enumerate(ROWS)]
    # on the CPU the packed compute row's memory='tiered' is served by the paged memory (its one RAM tier)
    assert [x["memory"] for x in r["rows"]] == ["direct", "direct", "tiered", "tiered", "paged"]


def test_ladder_explains_rows_slower_than_naive():
    rows = [{"name": n, "batch": 2, "tok_s": t, "ratio": t / 10, "memory": "tiered"}
            for n, t in zip(ROWS, (10.0, 12.0, 4.0, 11.0, 9.0))]
    text = format_ladder({"file": "m.gguf", "device": "cpu", "gen": 3, "threads": 1, "rows": rows})
    lines = text.splitlines()
    notes = [line for line in lines if line.startswith("  (slower than naive")]
    assert notes == [f"  (slower than naive: {MEASURES['+ prefetch']})",
                     f"  (slower than naive: {MEASURES['+ packed compute']})"]
    assert lines[lines.index(notes[0]) - 1].startswith("+ prefetch")
    assert lines[lines.index(notes[1]) - 1].startswith("+ packed compute")
