"""`torchrun --nproc-per-node 2 -m strata generate MODEL --expert-parallel`: rank 0 prints what one
process prints (greedy), the other rank nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from strata.gguf import open_model
from tests.fixtures.tiny import zoo

from .ranks import ROOT

ARGS = ["-p", "the cat sat on", "--temperature", "0", "-n", "8", "--ignore-eos", "--json", "--threads", "1"]


def _run(cmd: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 1, done.stdout  # rank 0's line only
    return {**json.loads(lines[0]), "stderr": done.stderr}


def test_torchrun_generate_equals_one_process():
    model = str(zoo().get("qwen3moe").gguf(None))
    one = _run([sys.executable, "-m", "strata", "generate", model, *ARGS])
    two = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "-m", "strata", "generate", model, *ARGS, "--expert-parallel", "--ep-timeout", "30", "--stats"])
    assert two["token_ids"] == one["token_ids"] and two["text"] == one["text"] and len(one["token_ids"]) == 8
    assert "ranks" not in one
    with open_model(model) as mf:  # per processed token: (world - 1) float32 rows of D per MoE layer
        per_token = len(mf.expert_layers) * mf.hparams.n_embd * 4
    ranks = two["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world_size"] == 2 for r in ranks)
    for r in ranks:
        assert r["net_bytes_sent_per_token"] == r["net_bytes_received_per_token"] == per_token
        assert r["tokens"] == one["prompt_tokens"] + 8 - 1 and r["tok_s"] > 0  # the last token is not fed back
        assert r["ms_per_token"]["collective"] > 0 and r["ms_per_token"]["compute"] > 0
    lines = [x for x in two["stderr"].splitlines() if x.startswith("rank ")]
    assert len(lines) == 2 and lines[1].startswith("rank 1/2: decode ")
    assert f"shared memory {per_token / 1024:.1f} KiB sent" in lines[1]  # both ranks on this machine


def test_expert_parallel_without_torchrun_is_one_line(capsys):
    from strata.cli import main

    env = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k in os.environ}
    try:
        code = main(["generate", str(zoo().get("qwen3moe").gguf(None)), "-p", "hi", "--expert-parallel"])
    finally:
        os.environ.update(env)
    err = capsys.readouterr().err
    assert code != 0 and "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set" in err and "torchrun" in err


def test_torchrun_bench_model():
    """`strata bench MODEL --expert-parallel`: rank 0 measures and prints one JSON object; rank 1 follows."""
    model = str(zoo().get("qwen3moe").gguf(None))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
                           "strata", "bench", model, "-p", "8", "-n", "4", "--batch", "1,2", "--reps", "1", "--threads",
                           "1", "--json", "--expert-parallel", "--ep-timeout", "30"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count('"memory_kind"') == 1, done.stdout  # rank 0's object only
    out = json.loads(done.stdout[done.stdout.index("{"):])
    assert out["prompt"] == 8 and out["pp_tok_s"]["mean"] > 0 and set(out["tg"]) == {"1", "2"}
    assert all(x["tokens_per_run"] == 3 * int(b) and x["tok_s"]["mean"] > 0 for b, x in out["tg"].items())
