"""`torchrun --nproc-per-node 2 -m strata serve MODEL --expert-parallel`: rank 0 serves (one port, one
banner), rank 1 follows its batches; chat completions (the openai client, and two at once: continuous
batching) have one process's greedy text; a killed rank 1 turns the open requests into 503s and
ends the server with a non-zero status within --ep-timeout."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import strata
from tests.fixtures.tiny import zoo

from .ranks import ROOT, free_port, rank_env

MESSAGES = [[{"role": "user", "content": "the cat sat on"}], [{"role": "user", "content": "a dog ran to the"}]]
EP_TIMEOUT = 10


class Torchrun:
    def __init__(self, model, log, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log, self._out = log, open(log, "w")
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "strata",
             "serve", str(model), "--expert-parallel", "--ep-timeout", str(EP_TIMEOUT), "--port", str(self.port),
             "--threads", "1", "--log-level", "warning", *args],
            cwd=ROOT, env=env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"not ready after {timeout} s:\n{self.log.read_text()}")

    def rank_pid(self, rank: int) -> int:
        """The pid of the worker process torchrun started as `rank`."""
        for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
            try:
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue
            if f"RANK={rank}".encode() in env and b"--ep-timeout" in cmd and \
                    str(self.port).encode() in cmd and b"torch.distributed.run" not in cmd:
                return pid
        raise AssertionError(f"no rank {rank} process")

    def close(self) -> int:
        """Stop rank 0 as a user would (SIGTERM): it releases rank 1, and torchrun ends with them."""
        if self.proc.poll() is None:
            try:
                os.kill(self.rank_pid(0), signal.SIGTERM)
                self.proc.wait(60)
            except (subprocess.TimeoutExpired, AssertionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._out.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def model_path():
    return zoo().get("qwen3moe").gguf("f32")


def _chat(url: str, messages, max_tokens: int = 8, timeout: float = 120) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=timeout,
                      json={"messages": messages, "temperature": 0, "max_tokens": max_tokens})


def test_two_ranks_serve_one_process_greedy_text(model_path, tmp_path):
    with strata.load(model_path, threads=1) as one:
        expected = [one.chat(m, temperature=0, max_tokens=8).text for m in MESSAGES]
    server = Torchrun(model_path, tmp_path / "serve.log")
    try:
        server.wait_ready()
        from openai import OpenAI

        client = OpenAI(base_url=server.url + "/v1", api_key="none", timeout=120)
        reply = client.chat.completions.create(model=model_path.stem, messages=MESSAGES[0], temperature=0, max_tokens=8)
        assert reply.choices[0].message.content == expected[0]
        with ThreadPoolExecutor(2) as pool:  # two at once: continuous batching across the ranks
            replies = list(pool.map(lambda m: _chat(server.url, m), MESSAGES))
        assert [r.status_code for r in replies] == [200, 200]
        assert [r.json()["choices"][0]["message"]["content"] for r in replies] == expected
    finally:
        server.close()  # (uvicorn re-raises the SIGTERM it handled: torchrun reports rank 0 as signalled)
    log = server.log.read_text()
    assert log.count("GET /health answers 200 when ready") == 1, log  # rank 0's banner only: rank 1 prints nothing


def _ranks(model, log, port: int, *args: str) -> list[subprocess.Popen]:
    """The two ranks started by hand (torchrun's environment, no torchrun: its agent would stop rank 0
    itself when rank 1 dies, and this tests what rank 0 does on its own)."""
    master, out = free_port(), open(log, "w")
    cmd = [sys.executable, "-m", "strata", "serve", str(model), "--expert-parallel", "--ep-timeout", str(EP_TIMEOUT),
           "--port", str(port), "--threads", "1", "--log-level", "warning", *args]
    return [subprocess.Popen(cmd, cwd=ROOT, env=rank_env(r, 2, master), stdout=out, stderr=subprocess.STDOUT)
            for r in range(2)]


@pytest.mark.parametrize("how", ["kill", "hang"])
def test_a_lost_rank_ends_the_server_with_503s(model_path, tmp_path, how):
    port, log = free_port(), tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}"
    ranks = _ranks(model_path, log, port, "--max-batch", "1")
    try:
        _wait_ready(url, ranks[0], log)
        with ThreadPoolExecutor(2) as pool:  # one running, one queued behind it (max-batch 1)
            open_requests = [pool.submit(_chat, url, [{"role": "user", "content": f"count {i}"}], 100000)
                             for i in range(2)]
            _wait_decoding_with_one_queued(url, open_requests)
            os.kill(ranks[1].pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            t0 = time.monotonic()
            replies = [f.result(timeout=EP_TIMEOUT + 60) for f in open_requests]
        for r in replies:
            assert r.status_code == 503, r.text
            assert "expert parallelism: rank 0 of 2:" in r.json()["error"]["message"]
        code = ranks[0].wait(EP_TIMEOUT + 30)
        assert time.monotonic() - t0 < EP_TIMEOUT + 30
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = log.read_text()
    assert code == 1 and "strata: error: expert parallelism: rank 0 of 2:" in text, text
    if how == "hang":
        assert f"did not answer within {EP_TIMEOUT} s" in text


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def _wait_decoding_with_one_queued(url: str, requests, timeout: float = 60) -> None:
    """Until the server decodes one request (tokens generated) with the other waiting behind it. A
    fixed sleep raced the machine: on a fast one both requests (491 tokens each, to the end of the
    fixture's 512-token context) were answered before the rank was lost."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert not any(r.done() for r in requests), [r.result().text[:300] for r in requests if r.done()]
        text = httpx.get(url + "/metrics", timeout=5).text
        if (_metric(text, "strata:requests_running") == 1 and _metric(text, "strata:requests_waiting") == 1
                and _metric(text, "strata:generation_tokens_total") > 0):
            return
        time.sleep(0.02)
    raise AssertionError(f"no request decoding with one waiting after {timeout} s:\n{text}")


def _wait_ready(url: str, proc: subprocess.Popen, log, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"not ready after {timeout} s:\n{log.read_text()}")


def test_new_requests_after_a_lost_rank_get_503():
    from types import SimpleNamespace

    from strata.distributed.group import GroupError
    from strata.server.errors import APIError
    from strata.server.metrics import ServerMetrics
    from strata.server.worker import EngineWorker

    engine = SimpleNamespace(busy=False, abort=lambda: None, running=[], waiting=[])
    lost = []
    runner = SimpleNamespace(tick_s=0.01, tick=lambda: (_ for _ in ()).throw(GroupError("rank 1 is gone")))
    worker = EngineWorker(SimpleNamespace(engine=engine, runner=runner), ServerMetrics(), 1, 1, on_fatal=lost.append)
    worker.start()
    worker._thread.join(10)  # the first idle heartbeat fails: the thread ends
    assert not worker._thread.is_alive() and [str(e) for e in lost] == ["rank 1 is gone"]
    with pytest.raises(APIError) as e:
        worker.submit(None)
    assert e.value.status == 503 and "rank 1 is gone" in str(e.value.message)
