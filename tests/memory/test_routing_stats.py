"""Routing statistics: counted by the tiered memory, saved by `--save-routing`, embedded by the
converter as `strata.routing.*` metadata, read back by `ModelFile.routing_counts()`, and used for
the initial placement (each layer's hottest experts in its device and host slots at start-up)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

import converters
import strata
from converters import TypePolicy, convert
from strata.cli import main
from strata.synth import build_checkpoint
from strata.errors import StrataFormatError
from strata.gguf import STRATA_ROUTING_COUNTS, STRATA_ROUTING_TOKENS, open_model
from strata.gguf.routing import read_routing_counts, save_routing_npz

from .tiered_fixture import DEVICE_SLOTS, HOST_SLOTS, N_EXPERTS, N_LAYERS, TOP_K, budgets, tiered

torch.set_num_threads(1)
FIRST = [17]  # a one-token prompt: every step after the first is a decode step
N_DECODE = 8


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The checkpoint, its plain GGUF, and routing statistics of a greedy run on it."""
    root = tmp_path_factory.mktemp("routing")
    hf = build_checkpoint(root / "hf", seed=3, num_hidden_layers=N_LAYERS, num_experts=N_EXPERTS,
                          num_experts_per_tok=TOP_K)
    plain = root / "plain.gguf"
    convert(hf, plain, TypePolicy(), n_threads=2)
    with load(plain) as m:
        m.generate(FIRST, temperature=0, max_tokens=N_DECODE, stop_token_ids=())
        counts, tokens = m.memory_stats().routing()
    save_routing_npz(root / "routing.npz", counts, tokens)
    seeded = root / "seeded.gguf"
    convert(hf, seeded, TypePolicy(), n_threads=2, routing_stats=root / "routing.npz")
    return {"root": root, "hf": hf, "plain": plain, "seeded": seeded, "counts": counts, "tokens": tokens}


def load(path: Path):
    return strata.load(path, threads=1, n_ctx=256, memory=tiered(path, "dequantized", prefetch_depth=0))


def test_every_routing_decision_is_counted(files):
    counts, tokens = files["counts"], files["tokens"]
    assert counts.shape == (N_LAYERS, N_EXPERTS) and counts.dtype == np.int64
    assert tokens == N_DECODE  # the prompt token, then one decode step per token but the last
    assert (counts.sum(axis=1) == tokens * TOP_K).all()


def test_cli_save_routing_round_trips_through_the_converter(files, capsys):
    root, plain = files["root"], files["plain"]
    text = root / "text.txt"
    text.write_text("the router sends each token to two experts of eight. " * 6)
    device_mem, host_mem = budgets(plain, "packed")
    npz = root / "cli.npz"
    assert main(["perplexity", str(plain), "-f", str(text), "--ctx", "32", "--threads", "1", "--slot-form", "packed",
                 "--device-mem", str(device_mem + (64 << 20)), "--host-mem", str(host_mem),
                 "--save-routing", str(npz)]) == 0
    assert "routing statistics of" in capsys.readouterr().err
    saved = np.load(npz)
    assert saved["tokens"] > 0 and (saved["counts"].sum(axis=1) == saved["tokens"] * TOP_K).all()
    out = root / "cli.gguf"
    r = subprocess.run([sys.executable, "-m", "strata.convert", str(files["hf"]), "-o", str(out), "--no-progress",
                        "--threads", "1", "--routing-stats", str(npz)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with open_model(out) as mf:
        counts, tokens = mf.routing_counts()
    assert np.array_equal(counts, saved["counts"]) and tokens == saved["tokens"]
    with open_model(plain) as mf:
        assert mf.routing_counts() is None


def test_cli_save_routing_with_the_cpu_default_paged_memory(files, capsys):
    npz = files["root"] / "paged.npz"
    assert main(["generate", str(files["plain"]), "-p", "the router", "-n", "4", "--threads", "1", "--ignore-eos",
                 "--save-routing", str(npz)]) == 0
    saved = np.load(npz)
    assert saved["tokens"] > 0 and (saved["counts"].sum(axis=1) == saved["tokens"] * TOP_K).all()


def test_save_routing_needs_the_tiered_memory(files, capsys):
    assert main(["generate", str(files["plain"]), "-p", "hi", "-n", "2", "--memory", "direct",
                 "--save-routing", str(files["root"] / "x.npz")]) == 1
    assert "--memory tiered" in capsys.readouterr().err


def test_converter_refuses_statistics_of_another_shape_in_one_line(files):
    bad = files["root"] / "bad.npz"
    save_routing_npz(bad, np.ones((N_LAYERS + 1, N_EXPERTS)), 10)
    r = subprocess.run([sys.executable, "-m", "strata.convert", str(files["hf"]), "-o", str(files["root"] / "b.gguf"),
                        "--no-progress", "--routing-stats", str(bad)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert f"[{N_LAYERS}, {N_EXPERTS}]" in r.stderr and f"[{N_LAYERS + 1}, {N_EXPERTS}]" in r.stderr
    assert not (files["root"] / "b.gguf").exists()


@pytest.mark.parametrize("counts, tokens, says", [
    ([1, 2, 3], 5, "= 24 counts, found 3"),
    (["a"] * 24, 5, "an array of numbers"),
    ([1] * 23 + [-1], 5, "finite counts >= 0"),
    ([1] * 24, 0, "a positive token count"),
    (7, 5, "an array of numbers"),
])
def test_malformed_routing_metadata_is_refused_naming_file_and_key(counts, tokens, says):
    with pytest.raises(StrataFormatError, match=says) as e:
        read_routing_counts(Path("m.gguf"), {STRATA_ROUTING_COUNTS: counts, STRATA_ROUTING_TOKENS: tokens}, 3, 8)
    assert "m.gguf" in str(e.value) and "strata.routing." in str(e.value)


def test_a_file_with_a_malformed_key_fails_when_its_counts_are_read(files, monkeypatch):
    def write_bad(w, npz, planned, n_experts, trunk_layers):
        w.add_key_value(STRATA_ROUTING_COUNTS, [1.0] * 5, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.FLOAT32)
        w.add_key_value(STRATA_ROUTING_TOKENS, 3, gguf.GGUFValueType.UINT64)

    monkeypatch.setattr(converters, "_write_routing", write_bad)
    out = files["root"] / "malformed.gguf"
    convert(files["hf"], out, TypePolicy(), n_threads=2, routing_stats="unused.npz")
    with open_model(out) as mf, pytest.raises(StrataFormatError, match="24 counts") as e:
        mf.routing_counts()
    assert str(out) in str(e.value) and STRATA_ROUTING_COUNTS in str(e.value)


def _hottest(counts: np.ndarray, n: int) -> list[set[int]]:
    return [set(np.argsort(-row, kind="stable")[:n].tolist()) for row in counts]


def test_start_up_fills_the_slots_with_each_layers_hottest_experts(files):
    with load(files["seeded"]) as m:
        mem = m.memory
        device = [set(np.flatnonzero(row >= 0).tolist()) for row in mem.policy.page_table]
        host = [set(mem.host.policy.resident(li).tolist()) for li in range(N_LAYERS)]
        assert device == _hottest(files["counts"], DEVICE_SLOTS)
        assert host == _hottest(files["counts"], HOST_SLOTS)
        assert all(mem.policy.is_ready(s) for s in mem.policy.page_table[mem.policy.page_table >= 0])
        t = m.memory_stats().totals()
        assert t["startup_loads"] == N_LAYERS * DEVICE_SLOTS and t["requests"] == t["device_misses"] == 0
    with load(files["plain"]) as m:
        assert (m.memory.policy.page_table < 0).all() and m.memory_stats().total("startup_loads") == 0


def test_statistics_raise_the_first_tokens_hit_rate_and_change_no_result(files):
    runs = {}
    for name in ("plain", "seeded"):
        with load(files[name]) as m:
            tokens = m.generate(FIRST, temperature=0, max_tokens=N_DECODE, stop_token_ids=()).token_ids
            rate = m.memory_stats().totals()["device_hit_rate"]
            runs[name] = (m.logits(FIRST + tokens), tokens, rate)
    (logits_p, tokens_p, rate_p), (logits_s, tokens_s, rate_s) = runs["plain"], runs["seeded"]
    assert torch.equal(logits_p, logits_s) and tokens_p == tokens_s
    print(f"device hit rate over the first {N_DECODE} tokens: {rate_p:.3f} without statistics, "
          f"{rate_s:.3f} with")
    assert rate_s > rate_p
