"""`strata serve` binds its socket before it loads or announces anything: a port in use (or an
address it cannot bind) is one line on stderr and exit status 1, every time, with nothing loaded;
the port it announces is the one it listens on."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from strata.commands.serve import listen
from strata.errors import StrataError

from .conftest import ROOT

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")


def serve(model, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strata", "serve", str(model), "--threads", "1", *args], cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=120)


@pytest.fixture
def busy_port():
    """A port with a listener on 127.0.0.1 (as another server would be)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_busy_port_is_one_line_and_exit_1_every_time(tiny_path, busy_port):
    """20 runs, 4 at a time: each fails before the model loads (no "model ready", no banner, no
    abort from a loading thread), with exit status 1 and one line naming the address."""
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda _: serve(tiny_path, "--port", str(busy_port)), range(20)))
    for run in runs:
        lines = run.stderr.splitlines()
        assert run.returncode == 1 and lines == [
            f"strata: error: cannot listen on 127.0.0.1:{busy_port}: address already in use "
            "(another server there? pick --port)"], (run.returncode, run.stderr)
        assert run.stdout == ""


def test_an_address_that_is_not_here_is_one_line(tiny_path):
    run = serve(tiny_path, "--host", "203.0.113.7", "--port", "8080")  # TEST-NET-3: no machine's own address
    assert run.returncode == 1
    assert run.stderr.splitlines() == ["strata: error: cannot listen on 203.0.113.7:8080: cannot assign requested "
                                       "address (not an address of this machine: pick --host)"]


def test_listen_refuses_by_address(busy_port):
    with pytest.raises(StrataError, match=rf"^cannot listen on 127\.0\.0\.1:{busy_port}: address already in use"):
        listen("127.0.0.1", busy_port)
    with pytest.raises(StrataError, match=r"^cannot listen on no-such-host\.invalid:80: "):
        listen("no-such-host.invalid", 80)
    with listen("127.0.0.1", 0) as sock:  # a free port: bound and listening before anything else
        with socket.create_connection(sock.getsockname(), timeout=5):
            pass


def test_the_banner_names_the_port_it_listens_on(tmp_path, tiny_path):
    """--port 0: the system picks a port; the banner names that one, and it answers at once."""
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "strata", "serve", str(tiny_path), "--port", "0", "--threads",
                                 "1", "--log-level", "warning"], cwd=ROOT, env=ENV, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        banner = log.read_text().splitlines()[0]
        url = banner.split(" on ", 1)[1].split(" ", 1)[0]
        assert banner.startswith("strata serve: ") and url.startswith("http://127.0.0.1:") and not url.endswith(":0")
        assert httpx.get(url + "/health", timeout=30).status_code in (200, 503)  # listening, loaded or not
    finally:
        proc.terminate()
        proc.wait(30)
