"""Launch the ranks of a test run as subprocesses over loopback (gloo), each with a hard timeout."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int, **extra: str) -> dict[str, str]:
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **extra)
    return env


def launch(world: int, args: list[str], **extra: str) -> list[subprocess.Popen]:
    port = free_port()
    return [subprocess.Popen([sys.executable, "-m", "tests.distributed.worker", *args], cwd=ROOT,
                             env=rank_env(r, world, port, **extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for r in range(world)]


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    """(return code, stderr) of each rank; every rank still running after `timeout` is killed and the
    test fails (no test hangs)."""
    out = []
    try:
        for p in procs:
            _, err = p.communicate(timeout=timeout)
            out.append((p.returncode, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def run_ranks(world: int, model: Path, tmp: Path, memory: str, compute: str, timeout: float = 300,
              mode: str = "run", **extra: str) -> list[dict]:
    """Each rank's results (the worker's "run" or "chunked" mode); `extra`: environment variables."""
    outs = [tmp / f"rank{r}.json" for r in range(world)]
    procs = launch(world, [str(model), str(tmp / "rank{}.json"), memory, compute, mode], **extra)
    # each worker writes to its own file: the name's {} is its rank
    codes = wait_all(procs, timeout)
    assert all(c == 0 for c, _ in codes), [e[-2000:] for _, e in codes]
    return [json.loads(o.read_text()) for o in outs]
