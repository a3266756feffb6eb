"""`strata perplexity` shows its progress as llama.cpp's tool does: each chunk's running PPL as it
is computed, the ETA after the first chunk, and the final estimate with its standard error; with
--json stdout holds one JSON line alone (the progress goes to a terminal's stderr, or nowhere)."""
from __future__ import annotations

import json
import math
import re
import subprocess

import pytest
import torch

import strata
from strata.cli import main
from strata.engine.perplexity import perplexity
from tests.convert.fixtures import corpus

from .pty_run import run_with_tty_stderr

N_CTX = 64


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("ppl") / "text.txt"
    path.write_text(" ".join(corpus(60, seed=4)), encoding="utf-8")
    return path


def test_running_values_and_standard_error_are_llama_cpps():
    g = torch.Generator().manual_seed(0)
    table = torch.randn(50, 50, generator=g) * 3  # next-token logits by current token

    def logits_fn(ids):
        return table[torch.tensor(ids)]

    tokens = torch.randint(0, 50, (5 * 16,), generator=g).tolist()
    seen = []
    r = perplexity(logits_fn, tokens, 16, bos=None, on_chunk=seen.append)
    nll = []  # per scored token, the same scoring done by hand
    for c in range(5):
        chunk = tokens[16 * c:16 * (c + 1)]
        for j in range(8, 15):
            nll.append(-float(table[chunk[j]].double().log_softmax(-1)[chunk[j + 1]]))
        assert seen[c].chunk == c + 1 and seen[c].n_chunks == 5
        assert seen[c].ppl == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-6)
    assert [s.seconds for s in seen] == sorted(s.seconds for s in seen)
    mean = sum(nll) / len(nll)
    var = sum(x * x for x in nll) / len(nll) - mean * mean
    assert r.ppl == pytest.approx(math.exp(mean), rel=1e-6) and r.ppl == seen[-1].ppl
    assert r.ppl_stderr == pytest.approx(math.exp(mean) * math.sqrt(var / (len(nll) - 1)), rel=1e-6)


def test_each_chunk_is_printed_as_it_is_done(qwen3, text, capsys, monkeypatch):
    """The running value of chunk 1 is on stdout before chunk 2 is computed, not all at the end."""
    real, before = strata.engine.Model.logits, []

    def spy(self, ids, batch_size=None):
        before.append(capsys.readouterr())
        return real(self, ids, batch_size)

    monkeypatch.setattr(strata.engine.Model, "logits", spy)
    code = main(["perplexity", str(qwen3.gguf("f32")), "-f", str(text), "--ctx", str(N_CTX), "--threads", "1"])
    rest = capsys.readouterr()
    out = "".join(b.out for b in before) + rest.out
    err = "".join(b.err for b in before) + rest.err
    assert code == 0 and len(before) >= 3
    assert "[1]" not in before[0].out and re.fullmatch(r"\[1\]\d+\.\d{4}", before[1].out)
    assert before[2].out.startswith(",[2]")
    values = re.findall(r"\[(\d+)\](\d+\.\d{4})", out.splitlines()[0])
    assert [int(i) for i, _ in values] == list(range(1, len(before) + 1))
    final = re.search(r"Final estimate: PPL = (\d+\.\d{4}) \+/- (\d+\.\d{4})", out)
    assert final and final.group(1) == values[-1][1]
    assert re.search(r"s per chunk, ETA \d+ s for the other \d+ chunks", before[1].err)  # after chunk 1
    assert "tokens scored" in err


def test_json_is_one_line_and_progress_goes_only_to_a_terminal(qwen3, text, python, subprocess_env):
    argv = [python, "-m", "strata", "perplexity", str(qwen3.gguf("f32")), "-f", str(text), "--ctx", str(N_CTX),
            "--threads", "1", "--json"]
    code, out, tty = run_with_tty_stderr(argv, subprocess_env)
    assert code == 0 and out.count("\n") == 1 and out.endswith("\n")
    r = json.loads(out)
    assert r["n_chunks"] >= 2 and r["ppl_stderr"] > 0
    assert "ETA" in tty and f"[{r['n_chunks']}]{r['ppl']:.4f}" in tty
    piped = subprocess.run(argv, capture_output=True, text=True, env=subprocess_env, timeout=300)
    assert piped.returncode == 0 and json.loads(piped.stdout)["ppl"] == r["ppl"]
    assert piped.stdout.count("\n") == 1 and piped.stderr == ""
