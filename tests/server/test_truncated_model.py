"""A model file cut to half its size under the server: the request being served ends with an error
naming the file (a streamed one in its last event), and the server goes on answering: /health,
and later requests (with the same error: the file is gone). Under direct, paged and tiered memory,
in the app in a child process (the cut inside a served request, tests/memory/truncate_while_running.py),
and in a `strata serve` process whose file is cut between two requests."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.fixtures.tiny import zoo

from .conftest import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "memory" / "truncate_while_running.py"
#: memory -> strata.load options (as in tests/memory/test_truncated_file.py)
MODES = {
    "direct": ["memory=direct"],
    "paged": ["memory=paged", "host_mem=448512"],
    "tiered": ["memory=tiered", "compute=float", "device_mem=6000000", "host_mem=448512", "prefetch_depth=1"],
}
BODY = {"prompt": "Hello world, this is a test", "max_tokens": 8, "temperature": 0}


def cut_message(path: Path, size: int) -> str:
    return (f"{path}: the file shrank while in use: it is now {size // 2} bytes, it had {size} when opened; "
            "load the model again")


@pytest.fixture
def model_copy(tmp_path) -> tuple[Path, int]:
    path = tmp_path / "shrinks.gguf"
    shutil.copyfile(zoo().get("qwen3moe").gguf(None), path)
    return path, path.stat().st_size


@pytest.mark.parametrize("mode", MODES)
def test_the_request_served_when_the_file_is_cut_gets_the_error_and_the_server_goes_on(model_copy, mode):
    path, size = model_copy
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(SCRIPT), str(path), "--serve", "threads=1", "n_ctx=128",
                          *MODES[mode]], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, f"status {run.returncode} (-7: SIGBUS): {run.stderr[-2000:]}"
    assert f"TRUNCATED {size // 2}" in run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    events = [line.removeprefix("data: ") for line in out["stream"]]
    assert out["stream_status"] == 200 and events[-1] == "[DONE]"
    texts, last = [json.loads(e) for e in events[:-2]], json.loads(events[-2])
    assert texts and all(t["choices"][0]["finish_reason"] is None for t in texts)  # tokens before the cut
    assert last == {"error": {"message": cut_message(path, size), "type": "server_error", "param": None,
                              "code": "engine_error"}}
    assert out["health"] == 200 and out["health_after"] == 200
    status, body = out["after"]
    assert status == 500 and body["error"]["message"] == cut_message(path, size)


def test_strata_serve_answers_after_its_file_shrank(model_copy, tmp_path):
    path, size = model_copy
    server = ServerProcess(path, tmp_path / "serve.log", "--memory", "direct")
    try:
        server.wait_ready()
        first = httpx.post(server.url + "/v1/completions", json=BODY, timeout=60)
        assert first.status_code == 200 and first.json()["choices"][0]["text"]
        os.truncate(path, size // 2)
        for _ in range(2):  # the next request, and one after it: each answered, neither served
            r = httpx.post(server.url + "/v1/completions", json=BODY, timeout=60)
            assert r.status_code == 500
            assert r.json()["error"]["message"] == cut_message(path, size)
            assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        assert server.proc.poll() is None
    finally:
        server.stop()
    log = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in log and "Bus error" not in log
