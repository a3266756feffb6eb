"""Expert parallelism over gloo on loopback, 2 and 3 ranks as subprocesses, for every family Strata
reads: the greedy path, a batch of two prompts and the logits equal one process's (also with prompts
prefilled in chunks, and for llama4's dense and MoE layers in turn) (logits within EP_REL_TOL of
their range: the ranks' partial sums are added in rank order, one process adds a token's experts in
expert order); the ranks' fused decode equals their per-call path bit for bit; the partial sums
through shared memory (ranks on one machine: the default here) equal gloo's all-gathers bit for
bit; a rank that dies or hangs is an error on rank 0, not a hang, either way; different files are
refused."""
from __future__ import annotations

import os
import time

import pytest
import torch

import strata
from strata.gguf import open_model
from tests.fixtures.tiny import zoo

from .ranks import launch, run_ranks, wait_all
from .worker import CHUNK, PROMPT, results

#: max |rank 0's logits - one process's| / max |one process's logits| (float32 rounding of a
#: different summation order, through a few layers).
EP_REL_TOL = 1e-5
CASES = [("qwen3moe", "direct", "float", 2), ("qwen3moe", "direct", "packed", 3), ("qwen3moe", "paged", "packed", 2),
         ("deepseek2", "direct", "float", 3), ("deepseek2", "paged", "packed", 2), ("llama4", "direct", "float", 2),
         ("llama4", "paged", "packed", 2),
         # every other family Strata reads, packed (the fused decode step's MoE under expert parallelism)
         ("mixtral", "paged", "packed", 2), ("qwen2moe", "direct", "packed", 2), ("olmoe", "paged", "packed", 3),
         ("deepseek3", "direct", "packed", 2), ("gptoss", "paged", "packed", 2), ("glm4moe", "direct", "packed", 2),
         ("minimax", "paged", "packed", 2), ("qwen3next", "direct", "packed", 2), ("qwen35moe", "paged", "packed", 2),
         ("mimo2", "paged", "packed", 2), ("hyv3", "direct", "packed", 2), ("deepseek32", "direct", "packed", 2),
         ("laguna", "direct", "packed", 2)]


def single(path, memory: str, compute: str, **engine) -> dict:
    with strata.load(path, threads=1, n_ctx=128, max_batch=2, memory=memory, compute=compute, **engine) as model:
        return results(model)


@pytest.mark.parametrize("key, memory, compute, world", CASES)
def test_ranks_equal_one_process(key, memory, compute, world, tmp_path):
    path = zoo().get(key).gguf(None)
    _check_equal(single(path, memory, compute), run_ranks(world, path, tmp_path, memory, compute), path, world)


@pytest.mark.parametrize("memory, compute", [("direct", "float"), ("paged", "packed")])
def test_chunked_prefill_ranks_equal_one_process(memory, compute, tmp_path):
    """Prompts longer than a step (max_step_tokens CHUNK): prefilled over several steps on every rank."""
    assert len(PROMPT) > 2 * CHUNK
    path = zoo().get("qwen3moe").gguf(None)
    ref = single(path, memory, compute, max_step_tokens=CHUNK)
    _check_equal(ref, run_ranks(2, path, tmp_path, memory, compute, mode="chunked"), path, 2)


def _check_equal(ref: dict, ranks: list[dict], path, world: int) -> None:
    fused, per_call = ref["decode_logprobs"]
    for got in ranks:  # the fused decode step runs the ranks' packed decode, agreeing with their per-call
        # path as one process's paths agree: bit for bit, or (DeepSeek-V3's latent attention with a
        # query LoRA, whose fused step orders its products otherwise) to float rounding
        assert got["plan"] == ref["plan"].replace("program", "fused step")
        if fused == per_call:
            assert got["decode_logprobs"][0] == got["decode_logprobs"][1]
        else:
            assert got["decode_logprobs"][0] == pytest.approx(got["decode_logprobs"][1], rel=1e-5, abs=1e-5)
    for got in ranks:  # every rank holds the same tokens and logits
        assert got["greedy"] == ref["greedy"]
        assert got["batch"] == ref["batch"]
        logits, expected = torch.tensor(got["logits"]), torch.tensor(ref["logits"])
        assert float((logits - expected).abs().max() / expected.abs().max()) <= EP_REL_TOL
    assert all(r["logits"] == ranks[0]["logits"] for r in ranks[1:])  # bit-equal across ranks
    check_net_bytes(path, ranks, world)


def check_net_bytes(path, ranks: list[dict], world: int) -> None:
    """Each rank's all-gathers moved (world - 1) float32 partial sums [T, D] each way per MoE layer:
    every processed token crossed every MoE layer once."""
    with open_model(path) as mf:
        L, D = len(mf.expert_layers), mf.hparams.n_embd
    for r in ranks:
        net = r["net"]
        assert net["rows"] == L * r["tokens"] and net["calls"] % L == 0 and net["calls"] > 0
        assert net["bytes_sent"] == net["bytes_received"] == r["tokens"] * L * D * 4 * (world - 1)
        assert net["collective_s"] > 0 and net["control_bytes"] > 0
        assert net["shared_calls"] == (0 if os.environ.get("STRATA_EP_SHM") == "0" else net["calls"])  # one machine


def test_shared_memory_sums_equal_gloo_all_gathers(tmp_path):
    """The ranks' partial sums through shared memory (one machine: the default) and through gloo
    (STRATA_EP_SHM=0) give the same logits and tokens, bit for bit."""
    path = zoo().get("qwen3moe").gguf(None)
    for sub in ("shm", "gloo"):
        (tmp_path / sub).mkdir()
    shared = run_ranks(2, path, tmp_path / "shm", "paged", "packed")
    gloo = run_ranks(2, path, tmp_path / "gloo", "paged", "packed", STRATA_EP_SHM="0")
    assert [r["net"]["shared_calls"] > 0 for r in shared] == [True, True]
    assert [r["net"]["shared_calls"] for r in gloo] == [0, 0]
    for a, b in zip(shared, gloo):
        assert (a["logits"], a["greedy"], a["batch"], a["decode_logprobs"]) == \
            (b["logits"], b["greedy"], b["batch"], b["decode_logprobs"])


def _failing_run(tmp_path, mode: str, world: int = 2, timeout_s: str = "20", shm: str = "1") -> list[tuple[int, str]]:
    path = zoo().get("qwen3moe").gguf(None)
    model = f"{path},{zoo().get('olmoe').gguf(None)}" if mode == "mismatch" else str(path)
    procs = launch(world, [model, str(tmp_path / "rank{}.json"), "direct", "packed", mode],
                   STRATA_EP_TIMEOUT=timeout_s, STRATA_EP_SHM=shm)
    try:
        return wait_all(procs[:1], timeout=240) + [(None, "")] * (world - 1)
    finally:  # the other ranks (one asleep for an hour in "hang") never outlive the test
        for p in procs[1:]:
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.mark.parametrize("shm", ["1", "0"])  # the sums through shared memory (one machine's default), or gloo
def test_a_rank_that_dies_is_an_error_on_rank_0(tmp_path, shm):
    t0 = time.monotonic()
    (code, err), *_ = _failing_run(tmp_path, "die", timeout_s="60", shm=shm)
    assert code == 1 and "error: expert parallelism: rank 0 of 2:" in err and "died or did not answer" in err
    assert time.monotonic() - t0 < 55  # noticed, not waited out (a killed peer's end is seen either way)


@pytest.mark.parametrize("shm", ["1", "0"])
def test_a_rank_that_hangs_is_an_error_on_rank_0_within_the_timeout(tmp_path, shm):
    (code, err), *_ = _failing_run(tmp_path, "hang", timeout_s="5", shm=shm)
    assert code == 1 and "did not answer within 5 s" in err, err[-3000:]


def test_a_rank_slower_to_start_than_the_step_timeout_is_waited_for(tmp_path):
    """Start-up (rendezvous, the start-up check, loading) waits up to STARTUP_TIMEOUT_S: a rank that
    joins and loads 6 s late under a 3 s step timeout is not a failure."""
    path = zoo().get("qwen3moe").gguf(None)
    procs = launch(2, [str(path), str(tmp_path / "rank{}.json"), "direct", "packed", "run"],
                   STRATA_EP_TIMEOUT="3", STRATA_TEST_LATE_S="6")
    codes = wait_all(procs, timeout=240)
    assert all(c == 0 for c, _ in codes), [e[-2000:] for _, e in codes]


def test_ranks_on_different_files_are_refused(tmp_path):
    (code, err), *_ = _failing_run(tmp_path, "mismatch")
    line = [x for x in err.splitlines() if x.startswith("error:")]
    assert code == 1 and len(line) == 1 and "rank 1's file (header checksum " in line[0]
    assert "differs from rank 0's (" in line[0] and "every rank must load the same GGUF file" in line[0]
