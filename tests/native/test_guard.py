"""The SIGBUS guard (native/guard.c, strata.native.MapGuard): a fault past the end of a guarded,
shrunk file mapping becomes counted zero pages, in Python's thread and in native worker threads;
faults elsewhere (unguarded maps, a closed guard) go to the handler installed before it (Python's
faulthandler) or kill the process as without it; the pager's mmap fallback fails only the reads
past the new end; a guarded model file's `check_intact` names the file. Every case that touches a
shrunk mapping runs in a child process: a failure there is a status, not the test run's death."""
from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from strata import native
from strata.errors import NativeError

ROOT = Path(__file__).resolve().parents[2]
PAGE = mmap.PAGESIZE


def child(code: str, *args: str, faulthandler: bool = False) -> subprocess.CompletedProcess:
    """Run `code` in a fresh Python (faulthandler enabled first when asked); argv[1:] = args."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTHONFAULTHANDLER", None)
    flags = ["-X", "faulthandler"] if faulthandler else []
    return subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(code), *args], capture_output=True,
                          text=True, env=env, timeout=120)


def result(run: subprocess.CompletedProcess) -> dict:
    assert run.returncode == 0, f"status {run.returncode} (-7: SIGBUS): {run.stderr[-2000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


def random_file(path: Path, nbytes: int, seed: int = 0) -> np.ndarray:
    data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    return data


def test_guard_turns_a_fault_past_the_end_into_counted_zero_pages(tmp_path):
    path = tmp_path / "shrinks.bin"
    data = random_file(path, 8 * PAGE)
    run = child("""
        import json, os, sys
        import numpy as np
        from strata.native import MapGuard
        path = sys.argv[1]
        m = np.memmap(path, dtype=np.uint8, mode="r")
        guard = MapGuard(m)
        before = guard.faults
        os.truncate(path, 3 * 4096 // 2)                  # the file now ends inside its second page
        first = np.array(m)                               # reads every page: one fault, the rest zeros
        again = np.array(m)                               # the zero pages read again: no new fault
        after = guard.faults
        with open(path, "r+b") as f:                      # the file grows back: the map's zeros stay
            f.truncate(m.size)
        print(json.dumps({"before": before, "after": after, "faults": guard.faults, "zeroed_from": guard.zeroed_from,
                          "first": first.tolist(), "again": again.tolist(), "regrown": np.array(m).tolist()}))
    """, str(path))
    out = result(run)
    assert (out["before"], out["after"], out["faults"]) == (0, 1, 1)
    assert out["zeroed_from"] == 2 * PAGE  # from the first page wholly past the end
    end = 3 * PAGE // 2
    for key in ("first", "again", "regrown"):
        got = np.array(out[key], dtype=np.uint8)
        assert np.array_equal(got[:end], data[:end]), key  # the bytes the file still has
        assert not got[end:].any(), key  # the cut page's tail and every page after it: zeros


def test_faults_in_native_worker_threads_are_guarded_too(tmp_path):
    path = tmp_path / "rows.q8_0"
    n_rows, row_len = 512, 256  # Q8_0: 8 blocks of 34 bytes a row, 272 bytes
    values = np.random.default_rng(1).standard_normal((n_rows, row_len)).astype(np.float32)
    path.write_bytes(native.quantize("Q8_0", values).tobytes())
    whole = native.dequantize("Q8_0", np.fromfile(path, dtype=np.uint8), (n_rows, row_len))
    keep = 64 * 1024  # whole pages of the file: rows before keep // 272 are intact
    run = child("""
        import json, os, sys
        import numpy as np
        from strata import native
        path, n_rows, row_len, keep = sys.argv[1], *map(int, sys.argv[2:])
        m = np.memmap(path, dtype=np.uint8, mode="r")
        guard = native.MapGuard(m)
        os.truncate(path, keep)
        out = np.empty((n_rows, row_len), dtype=np.float32)
        native.dequantize_into("Q8_0", m, out, n_threads=2)   # the C workers touch the missing pages
        print(json.dumps({"faults": guard.faults, "out": out.tolist()}))
    """, str(path), str(n_rows), str(row_len), str(keep))
    out = result(run)
    got = np.array(out["out"], dtype=np.float32)
    intact = keep // 272
    assert out["faults"] >= 1
    assert np.array_equal(got[:intact], whole[:intact])
    assert not got[keep // 272 + 1:].any()  # rows wholly past the end read as zero blocks


UNGUARDED_FAULT = """
    import os, sys
    import numpy as np
    from strata.native import MapGuard
    guarded, other = sys.argv[1:3]
    keep = MapGuard(np.memmap(guarded, dtype=np.uint8, mode="r"))   # the guard's handler is installed
    m = np.memmap(other, dtype=np.uint8, mode="r")
    {close}
    os.truncate(other, 10)
    print("touching", flush=True)
    print(int(m[5 * 4096]))
"""


@pytest.mark.parametrize("faulthandler", [True, False], ids=["faulthandler", "default"])
def test_a_fault_outside_every_guarded_range_goes_to_the_handler_before(tmp_path, faulthandler):
    guarded, other = tmp_path / "guarded.bin", tmp_path / "other.bin"
    random_file(guarded, 4 * PAGE)
    random_file(other, 8 * PAGE)
    run = child(UNGUARDED_FAULT.format(close=""), str(guarded), str(other), faulthandler=faulthandler)
    assert run.returncode == -signal.SIGBUS, run.stderr
    assert run.stdout.strip() == "touching"
    # faulthandler was installed first: the guard passed the fault on to it, which named it
    assert ("Fatal Python error: Bus error" in run.stderr) == faulthandler, run.stderr


def test_a_closed_guard_no_longer_covers_its_range(tmp_path):
    guarded, other = tmp_path / "guarded.bin", tmp_path / "other.bin"
    random_file(guarded, 4 * PAGE)
    random_file(other, 8 * PAGE)
    close = "g = MapGuard(m); g.close()"
    run = child(UNGUARDED_FAULT.format(close=close), str(guarded), str(other))
    assert run.returncode == -signal.SIGBUS, run.stderr


def test_guard_wants_a_whole_mapping():
    with pytest.raises(ValueError, match="whole mapping"):
        native.MapGuard(np.zeros(3 * PAGE, dtype=np.uint8)[1:])
    g = native.MapGuard(np.memmap(__file__, dtype=np.uint8, mode="r"))
    assert (g.faults, g.zeroed_from) == (0, g.nbytes)
    g.close()
    assert g.closed and g.faults == 0


def test_pager_mmap_fallback_fails_the_reads_past_the_new_end_only(tmp_path):
    path = tmp_path / "shrinks.bin"
    data = random_file(path, 1 << 20, seed=3)
    run = child("""
        import json, mmap, os, sys
        import numpy as np
        from strata.native import Pager
        from strata.errors import NativeError
        path = sys.argv[1]
        buf = np.frombuffer(mmap.mmap(-1, 1 << 20), dtype=np.uint8)
        out = {}
        with Pager(path, direct=False, fallback="mmap") as pager:
            os.truncate(path, 4096)
            try:
                pager.read(8192, 100_000, buf)
            except NativeError as e:
                out["bad"] = str(e)
            start = pager.read(0, 4096, buf)           # bytes the file still has, read after the fault
            out["ok"] = buf[start:start + 4096].tolist()
            try:
                pager.read(4096, 8192, buf)            # past the end, in pages already zeros: still refused
            except NativeError as e:
                out["again"] = str(e)
            out["failed"] = pager.stats()["failed"]
        print(json.dumps(out))
    """, str(path))
    out = result(run)
    assert out["bad"].endswith(f"read of bytes [8192, 108192): the file ended early: it is now 4096 bytes, "
                               f"it had {data.size} bytes at open (truncated since?)"), out["bad"]
    assert np.array_equal(np.array(out["ok"], dtype=np.uint8), data[:4096])
    assert "read of bytes [4096, 12288): the file ended early" in out["again"]
    assert out["failed"] == 2


def test_guarded_model_file_names_itself_when_cut_short(tmp_path):
    from tests.gguf.fixtures import Dims, write_qwen3moe

    path = tmp_path / "model.gguf"
    write_qwen3moe(path, Dims(n_layers=2, n_experts=4))
    size = path.stat().st_size
    run = child("""
        import json, os, sys
        import numpy as np
        from strata import native
        from strata.errors import StrataError
        from strata.gguf import open_model
        path, size = sys.argv[1], int(sys.argv[2])
        original = open(path, "rb").read()
        out = {}
        with open_model(path, guard=native.MapGuard) as mf:
            last = max(mf.tensors.values(), key=lambda t: t.offset)
            os.truncate(path, size // 2)
            try:
                mf.check_intact()
            except StrataError as e:
                out["shorter"] = str(e)
            out["zeros"] = not np.asarray(mf.tensor_data(last.name)).any()   # read past the end: zeros
            with open(path, "r+b") as f:              # the same bytes back: the map read zeros meanwhile
                f.write(original)
            try:
                mf.check_intact()
            except StrataError as e:
                out["regrown"] = str(e)
        print(json.dumps(out))
    """, str(path), str(size))
    out = result(run)
    assert out["shorter"] == (f"{path}: the file shrank while in use: it is now {size // 2} bytes, it had {size} "
                              "when opened; load the model again")
    assert out["zeros"]
    assert out["regrown"] == (f"{path}: the file shrank while in use: it is {size} bytes again, but parts of it were "
                              f"read while it was shorter, it had {size} when opened; load the model again")


def test_a_full_table_is_one_error_and_closing_makes_room():
    m = np.memmap(__file__, dtype=np.uint8, mode="r")
    guards = []
    try:
        with pytest.raises(NativeError, match=f"{native.MAX_GUARDED} mappings are guarded already"):
            for _ in range(native.MAX_GUARDED + 1):
                guards.append(native.MapGuard(m))
        assert 0 < len(guards) <= native.MAX_GUARDED
        guards.pop().close()
        guards.append(native.MapGuard(m))  # the room one close made
    finally:
        for g in guards:
            g.close()
