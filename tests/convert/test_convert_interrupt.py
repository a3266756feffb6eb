"""A conversion stopped half-way (Ctrl-C, SIGTERM, SIGKILL, a full disk) leaves no .gguf behind."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata.synth import write_checkpoint
from converters.writer import remove_stale_temps

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def big_ckpt(tmp_path_factory) -> Path:
    """~100 MB of bfloat16 experts: a few seconds of single-threaded Q4_K work."""
    folder = tmp_path_factory.mktemp("big") / "ckpt"
    write_checkpoint(folder, hidden=1024, n_layers=2, n_experts=16, moe_ff=512)
    return folder


#: `python -m strata.convert` whose writer stalls once 2 MB of tensor data are encoded, so the signal
#: of a test always arrives mid-write however busy the machine (else a fast converter can finish
#: first and exit 0). Only the encoder is wrapped; the writer and its clean-up are the real ones.
STALLED_CONVERT = """
import sys, time
import converters.writer as writer
from strata.convert import main
encode, done = writer.encode, [0]
def stalled(*args, **kwargs):
    if done[0] >= 2 << 20:
        while True:
            time.sleep(0.05)  # the test's signal lands here
    data = encode(*args, **kwargs)
    done[0] += data.nbytes
    return data
writer.encode = stalled
sys.exit(main(sys.argv[1:]))
"""


def _default_sigint() -> None:
    """Give the converter SIGINT's default action, as a terminal would.

    A runner that starts the tests in the background of a non-interactive shell (as CI's may) hands
    its children SIGINT ignored, and Python then never raises KeyboardInterrupt: the stalled
    converter would wait for a signal that never comes."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(ckpt: Path, out: Path, stall: bool = True, preexec_fn=None, **popen) -> subprocess.Popen:
    def preexec():
        _default_sigint()
        if preexec_fn is not None:
            preexec_fn()

    env = dict(os.environ, PYTHONPATH=str(REPO))
    entry = ["-c", STALLED_CONVERT] if stall else ["-m", "strata.convert"]
    return subprocess.Popen([sys.executable, *entry, str(ckpt), "-o", str(out), "--threads", "1",
                             "--no-progress"], env=env, stderr=subprocess.PIPE, text=True, preexec_fn=preexec,
                            **popen)


def _wait_for_data(proc: subprocess.Popen, out: Path, min_bytes: int = 1 << 20, timeout: float = 60) -> Path:
    """The temporary file, once the converter is streaming tensor data into it."""
    tmp = out.with_name(f".{out.name}.{proc.pid}.tmp")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tmp.exists() and tmp.stat().st_size >= min_bytes:
            return tmp
        assert proc.poll() is None, f"converter ended early: {proc.stderr.read()}"
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("converter never started writing tensor data")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_removes_partial_output(big_ckpt, tmp_path, sig):
    out = tmp_path / "model.gguf"
    proc = _start(big_ckpt, out)
    tmp = _wait_for_data(proc, out)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert proc.returncode == 130, proc.stderr.read()
    assert not out.exists() and not tmp.exists()
    assert list(tmp_path.iterdir()) == []


def test_sigkill_leaves_no_gguf_and_next_run_cleans_up(big_ckpt, tmp_path):
    out = tmp_path / "model.gguf"
    proc = _start(big_ckpt, out)
    _wait_for_data(proc, out)
    proc.kill()
    proc.wait(timeout=60)
    assert not out.exists()
    assert [p.suffix for p in tmp_path.iterdir()] == [".tmp"]  # hidden, and not a .gguf
    remove_stale_temps(out)  # what the next conversion to this path does first
    assert list(tmp_path.iterdir()) == []


def test_full_disk_removes_partial_output(big_ckpt, tmp_path):
    """RLIMIT_FSIZE makes writes past 8 MB fail as a full disk would (EFBIG instead of ENOSPC)."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 20, 8 << 20))

    out = tmp_path / "model.gguf"
    proc = _start(big_ckpt, out, stall=False, preexec_fn=limit)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]  # (gguf-py warns first that this tokenizer has no merges)
    assert last.startswith("strata: error: ") and "write failed" in last and str(out) in last
    assert list(tmp_path.iterdir()) == []
