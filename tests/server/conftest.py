"""`strata serve` subprocesses for the server tests: one per test module, on a free port, with
the tiny qwen3moe fixture model (tests/fixtures/tiny.py)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures.tiny import zoo

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A running `python -m strata serve MODEL ...`; `url` is its base URL."""

    def __init__(self, model: Path, log: Path, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                   OMP_NUM_THREADS="1", PYTHONIOENCODING="utf-8")
        self._log_file = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "strata", "serve", str(model), "--port", str(self.port),
                                      "--threads", "1", "--log-level", "warning", *args],
                                     env=env, stdout=self._log_file, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120.0) -> list[int]:
        """Poll /health until 200; the statuses seen on the way."""
        seen, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"strata serve exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                status = httpx.get(self.url + "/health", timeout=5).status_code
            except httpx.TransportError:
                status = None
            if status is not None and (not seen or seen[-1] != status):
                seen.append(status)
            if status == 200:
                return seen
            time.sleep(0.05)
        raise RuntimeError(f"strata serve not ready after {timeout} s:\n{self.log.read_text()}")

    def stop(self) -> int:
        self.proc.terminate()
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._log_file.close()
        return code


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    return zoo().get("qwen3moe").gguf("f32")


@pytest.fixture(scope="session")
def tiny_model(tiny_path):
    """The fixture model in this process, for outputs to compare the server's with."""
    import strata

    with strata.load(tiny_path, threads=1) as model:
        yield model


def start(request, tmp_path_factory, tiny_path: Path, *args: str) -> ServerProcess:
    server = ServerProcess(tiny_path, tmp_path_factory.mktemp("serve") / "server.log", *args)
    request.addfinalizer(server.stop)
    server.wait_ready()
    return server


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, tiny_path) -> ServerProcess:
    """`strata serve` with the test module's SERVE_ARGS, one for the module."""
    return start(request, tmp_path_factory, tiny_path, *request.module.SERVE_ARGS)


@pytest.fixture(scope="module")
def client(server):
    """The official `openai` client on `server`."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
