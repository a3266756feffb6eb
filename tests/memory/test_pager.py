"""Native pager: bytes read equal the file's (expert slabs of real GGUF fixtures, random ranges),
through O_DIRECT, buffered pread and mmap; every bad request is a NativeError naming the reason;
concurrency from several Python threads; close with reads in flight; the page cache stays cold."""
import ctypes
import mmap
import os
import threading

import numpy as np
import pytest

from strata.errors import NativeError
from strata.gguf import PARTS, open_model
from strata.native import Pager, PagerTimeoutError, numa_node_count, numa_node_of
from tests.gguf.fixtures import Dims, write_deepseek2, write_gpt_oss, write_qwen3moe, write_qwen3moe_fused

MODES = {  # name -> Pager keyword arguments
    "direct": dict(direct=True),
    "pread": dict(direct=False),
    "mmap": dict(direct=False, fallback="mmap"),
}


def aligned(nbytes: int) -> np.ndarray:
    """A page-aligned writable uint8 buffer (anonymous mapping)."""
    return np.frombuffer(mmap.mmap(-1, max(nbytes, 1)), dtype=np.uint8)[:nbytes]


def slot_for(pager: Pager, nbytes: int) -> np.ndarray:
    """A buffer sized as the host tier sizes one: the slab rounded up plus one alignment unit."""
    a = pager.info.align or 1
    return aligned(-(-nbytes // a) * a + a)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("pager-models")
    d = Dims(n_layers=3, n_experts=8)
    writers = {"qwen3moe": write_qwen3moe, "qwen3moe_fused": write_qwen3moe_fused,
               "deepseek2": write_deepseek2, "gpt_oss": write_gpt_oss}
    paths = {}
    for name, write in writers.items():
        write(root / f"{name}.gguf", d)
        paths[name] = root / f"{name}.gguf"
    return paths


@pytest.fixture(scope="module")
def random_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pager-random") / "random.bin"
    data = np.random.default_rng(7).integers(0, 256, 3 * 2**20 + 1234, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    return path, data


# ---- bytes read equal the file -------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["qwen3moe", "qwen3moe_fused", "deepseek2", "gpt_oss"])
def test_every_expert_slab_equals_model_file(models, name, mode):
    with open_model(models[name]) as mf, Pager(mf.path, n_threads=3, **MODES[mode]) as pager:
        slabs = [mf.expert(layer, e, part) for layer in mf.expert_layers
                 for e in range(mf.hparams.n_experts) for part in PARTS]
        bufs = [slot_for(pager, s.nbytes) for s in slabs]
        tickets = [pager.submit(s.offset, s.nbytes, b) for s, b in zip(slabs, bufs)]
        for slab, buf, ticket in zip(slabs, bufs, tickets):
            start = pager.wait(ticket)
            assert np.array_equal(buf[start:start + slab.nbytes], mf.expert_data(slab)), slab
        stats = pager.stats()
    assert stats["completed"] == len(slabs) and stats["failed"] == 0
    assert stats["direct"] == (len(slabs) if mode == "direct" else 0)
    assert stats["bytes_requested"] == sum(s.nbytes for s in slabs)


@pytest.mark.parametrize("mode", MODES)
def test_random_ranges_equal_file_bytes(random_file, mode):
    path, data = random_file
    rng = np.random.default_rng(11)
    with Pager(path, n_threads=4, chunk_bytes=64 * 1024, **MODES[mode]) as pager:
        for _ in range(60):
            offset = int(rng.integers(0, data.size))
            nbytes = int(rng.integers(0, min(data.size - offset, 700_000) + 1))
            buf = slot_for(pager, nbytes)
            start = pager.read(offset, nbytes, buf)
            assert np.array_equal(buf[start:start + nbytes], data[offset:offset + nbytes]), (offset, nbytes)


def test_direct_reads_enclosing_aligned_range(random_file):
    path, data = random_file
    with Pager(path, direct=True) as pager:
        a = pager.info.align
        assert a >= 512 and a & (a - 1) == 0
        offset, nbytes = 3 * a + 32, 5 * a  # 32-byte aligned like a GGUF slab
        buf = aligned(6 * a)  # round_up(nbytes) + one unit: the bound the host tier relies on
        start = pager.read(offset, nbytes, buf)
        assert start == 32 and pager.span(offset, nbytes) == (3 * a, 9 * a)
        assert np.array_equal(buf, data[3 * a:9 * a])  # the whole aligned range landed in dst
        # The last block of the file is partial: the direct read comes back short, and that is fine.
        tail = data.size - 100
        start = pager.read(tail, 100, buf)
        assert np.array_equal(buf[start:start + 100], data[tail:])
        assert pager.stats()["direct"] == 2


def test_unaligned_or_tight_destination_falls_back_to_buffered(random_file):
    path, data = random_file
    with Pager(path) as pager:
        assert pager.info.direct  # auto mode found O_DIRECT on this file system
        backing = aligned(8192 + 1)
        unaligned = backing[1:]  # off by one byte: O_DIRECT would refuse it
        assert pager.read(1000, 4096, unaligned) == 0
        assert np.array_equal(unaligned[:4096], data[1000:5096])
        tight = aligned(4096)  # aligned, but too small for the enclosing range [512, 5120)
        assert pager.read(1000, 4096, tight) == 0
        assert np.array_equal(tight, data[1000:5096])
        assert pager.stats()["direct"] == 0 and pager.stats()["completed"] == 2


def test_large_read_is_split_across_workers(random_file):
    path, data = random_file
    with Pager(path, n_threads=4, chunk_bytes=16 * 1024) as pager:
        buf = slot_for(pager, data.size)
        start = pager.read(0, data.size, buf)
        assert np.array_equal(buf[start:start + data.size], data)
        stats = pager.stats()
    assert stats["chunks"] == -(-stats["bytes_read"] // (16 * 1024)) >= 190
    assert stats["bytes_read"] >= data.size and stats["read_ns"] > 0 and stats["busy_ns"] > 0


def test_zero_length_read_and_torch_destination(random_file):
    torch = pytest.importorskip("torch")
    path, data = random_file
    with Pager(path) as pager:
        assert pager.read(data.size, 0, bytearray(0)) == 0
        dst = torch.zeros(10_000, dtype=torch.uint8)
        start = pager.read(12345, 5000, dst)
        assert np.array_equal(dst.numpy()[start:start + 5000], data[12345:17345])


# ---- errors --------------------------------------------------------------------------------

def test_bad_requests_are_native_errors(random_file):
    path, data = random_file
    buf = aligned(8192)
    with Pager(path) as pager:
        with pytest.raises(NativeError, match=r"bytes \[-1, 99\): outside the file"):
            pager.submit(-1, 100, buf)
        with pytest.raises(NativeError, match=rf"bytes \[{data.size + 1}, {data.size + 2}\): outside the file \(0..{data.size}"):
            pager.submit(data.size + 1, 1, buf)
        with pytest.raises(NativeError, match="outside the file"):
            pager.submit(data.size - 10, 11, buf)  # length past EOF
        with pytest.raises(NativeError, match="destination holds 8192 bytes, the read needs 8193"):
            pager.submit(0, 8193, buf)
        with pytest.raises(ValueError, match="C-contiguous"):
            pager.submit(0, 10, np.zeros((64, 64), np.uint8)[:, ::2])
        with pytest.raises(TypeError, match="writable buffer"):
            pager.submit(0, 10, b"read-only bytes")
        for bad in (0, -5, 123456789):
            with pytest.raises(NativeError, match=f"ticket {bad}: not a pending ticket"):
                pager.wait(bad)
        ticket = pager.submit(0, 10, buf)
        pager.wait(ticket)
        with pytest.raises(NativeError, match="not a pending ticket"):
            pager.wait(ticket)  # spent
        with pytest.raises(NativeError, match="not a pending ticket"):
            pager.poll(ticket)
        assert pager.stats()["in_flight"] == 0
    with pytest.raises(NativeError, match="pager is closed"):
        pager.submit(0, 10, buf)
    with pytest.raises(NativeError, match="pager is closed"):
        pager.wait(ticket)


def test_open_errors(tmp_path):
    with pytest.raises(NativeError, match=r"missing.gguf: cannot open for reading: No such file .*errno 2"):
        Pager(tmp_path / "missing.gguf")
    with pytest.raises(NativeError, match="cannot open for reading: Is a directory"):
        Pager(tmp_path)
    with pytest.raises(ValueError, match="threads must be an integer in 1..256"):
        Pager(tmp_path, n_threads=0)
    with pytest.raises(ValueError, match="fallback must be one of"):
        Pager(tmp_path, fallback="splice")


def test_file_truncated_after_open_fails_that_ticket_only(tmp_path):
    path = tmp_path / "shrinks.bin"
    data = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    for mode in MODES:
        if mode == "mmap":
            continue  # its map's pages past the new end fault: in a child process, tests/native/test_guard.py
        path.write_bytes(data.tobytes())
        with Pager(path, **MODES[mode]) as pager:
            os.truncate(path, 4096)
            buf = aligned(1 << 20)
            ok = pager.submit(0, 4096, buf[:8192])
            bad = pager.submit(8192, 100_000, buf[8192:])
            with pytest.raises(NativeError, match=r"bytes \[8192, 108192\): the file ended early: it is now 4096 "
                                                  rf"bytes, it had {data.size} bytes at open"):
                pager.wait(bad)
            start = pager.wait(ok)
            assert np.array_equal(buf[start:start + 4096], data[:4096])
            assert pager.stats()["failed"] == 1


def test_too_many_uncollected_requests(random_file):
    path, _ = random_file
    with Pager(path, n_threads=1) as pager:
        buf = bytearray(0)
        tickets = [pager.submit(0, 0, buf) for _ in range(pager.info.max_requests)]
        with pytest.raises(NativeError, match="too many uncollected requests"):
            pager.submit(0, 0, buf)
        pager.wait(tickets[0])
        tickets[0] = pager.submit(0, 0, buf)  # a collected slot is reused
        assert len(set(tickets)) == len(tickets)


def test_wait_timeout_leaves_request_pending(random_file):
    path, data = random_file
    with Pager(path, n_threads=1, chunk_bytes=4096, direct=True) as pager:
        buf = slot_for(pager, data.size)
        ticket = pager.submit(0, data.size, buf)
        try:
            pager.wait(ticket, timeout=0)
            timed_out = False
        except PagerTimeoutError as exc:
            timed_out = True
            assert "request still in flight" in str(exc) and isinstance(exc, NativeError)
        start = pager.wait(ticket) if timed_out else 0
        assert np.array_equal(buf[start:start + data.size], data)
        with pytest.raises(ValueError, match="timeout"):
            pager.wait(ticket, timeout=-1)


# ---- concurrency and close -----------------------------------------------------------------

def test_concurrent_submits_from_python_threads(random_file):
    path, data = random_file
    failures = []
    with Pager(path, n_threads=4, chunk_bytes=32 * 1024) as pager:
        def client(seed):
            rng = np.random.default_rng(seed)
            try:
                for _ in range(10):
                    batch = []
                    for _ in range(8):
                        offset = int(rng.integers(0, data.size - 1))
                        nbytes = int(rng.integers(1, min(200_000, data.size - offset) + 1))
                        buf = slot_for(pager, nbytes)
                        batch.append((offset, nbytes, buf, pager.submit(offset, nbytes, buf)))
                    for offset, nbytes, buf, ticket in reversed(batch):
                        start = pager.wait(ticket)
                        if not np.array_equal(buf[start:start + nbytes], data[offset:offset + nbytes]):
                            failures.append((offset, nbytes))
            except Exception as exc:  # reported below, with the thread's seed
                failures.append((seed, exc))

        threads = [threading.Thread(target=client, args=(seed,)) for seed in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert pager.stats()["completed"] == 6 * 10 * 8
    assert failures == []


def test_close_with_reads_in_flight(random_file):
    path, data = random_file
    pager = Pager(path, n_threads=2, chunk_bytes=4096)
    bufs = [slot_for(pager, data.size) for _ in range(4)]
    tickets = [pager.submit(0, data.size, b) for b in bufs]
    tickets += [pager.submit(i * 4096, 4096, aligned(8192)) for i in range(200)]
    errors = []

    def waiter(p):  # the pager as an argument: the thread drops it when done, so `del pager` frees it
        try:
            p.wait(tickets[-1])
        except NativeError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=waiter, args=(pager,))
    t.start()
    pager.close()
    t.join(timeout=10)
    assert not t.is_alive()
    assert all("closed" in e for e in errors)
    with pytest.raises(NativeError, match="pager is closed"):
        pager.wait(tickets[0])
    stats = pager.stats()
    assert stats["in_flight"] == 0 and stats["completed"] == stats["submitted"] == 204
    pager.close()  # idempotent
    del pager  # frees the native pager; nothing may touch the buffers afterwards


def test_pager_dropped_with_reads_in_flight(random_file):
    path, data = random_file
    for _ in range(5):
        pager = Pager(path, n_threads=2, chunk_bytes=4096)
        for i in range(50):
            pager.submit(i * 1000, 50_000, np.empty(60_000, np.uint8))  # kept alive by the pager
        del pager  # __del__ closes (joining the workers) before the buffers are released


# ---- NUMA and the page cache ---------------------------------------------------------------

def test_numa_is_a_no_op_on_one_node(random_file):
    path, _ = random_file
    n = numa_node_count()
    assert n >= 1
    buf = aligned(4096)
    assert 0 <= numa_node_of(buf) < n
    with Pager(path) as pager:
        pager.bind_node(numa_node_of(buf))
        with pytest.raises(NativeError, match=f"NUMA node {n} of {n}"):
            pager.bind_node(n)
        assert pager.read(0, 100, buf) == 0


def _cached_pages(path) -> int:
    """Pages of `path` in the page cache (mincore over a read-only mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        vec = ctypes.create_string_buffer(-(-size // mmap.PAGESIZE))
        assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec.raw)


def test_direct_reads_leave_the_page_cache_cold(tmp_path):
    """O_DIRECT means no second copy of the slabs in the page cache."""
    path = tmp_path / "cold.bin"
    data = aligned(1 << 20)
    data[:] = np.random.default_rng(5).integers(0, 256, data.size, dtype=np.uint8)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
    except OSError:
        pytest.skip("this file system refuses O_DIRECT")
    try:
        os.write(fd, data)  # a direct write leaves no cached copy
    finally:
        os.close(fd)
    if _cached_pages(path) != 0:
        pytest.skip("the file's pages are cached after a direct write: cannot observe the cache here")
    buf = aligned(data.size + 8192)
    with Pager(path, direct=True, n_threads=2, chunk_bytes=128 * 1024) as pager:
        start = pager.read(1000, data.size - 2000, buf)
    assert np.array_equal(buf[start:start + data.size - 2000], data[1000:-1000])
    assert _cached_pages(path) == 0
    with Pager(path, direct=False) as pager:  # the measure itself works: buffered reads cache
        pager.read(0, data.size, buf)
    assert _cached_pages(path) == data.size // mmap.PAGESIZE


# ---- the benchmark runs end to end ---------------------------------------------------------

def test_bench_pager_cli_reports_both_rates(models):
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "strata", "bench", "pager", str(models["qwen3moe"]),
                          "--json", "--repeat", "1", "--depth", "4"], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    assert r["n_slabs"] == 3 * 8 * 3 and r["align"] >= 512
    assert r["sequential_direct_gbs"] > 0 and r["pager_slabs_gbs"] > 0 and r["ratio"] > 0
    assert r["host_tier"]["misses"] == 3 * 8 and r["host_tier"]["gbs"] > 0
    missing = subprocess.run([sys.executable, "-m", "strata", "bench", "pager", "missing.gguf"],
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "no such file or directory" in missing.stderr and "Traceback" not in missing.stderr


def test_random_slab_rate_reads_slabs_up_to_the_limit(models, monkeypatch):
    """The out-of-RAM benchmark's second disk rate: expert slabs in random order, stopping once
    `limit` bytes are queued; a limit past the file reads every slab once."""
    import strata.bench.pager as bp

    read = []
    real = bp.pager_slab_rate

    def spy(pager, slabs, depth):
        read.append(list(slabs))
        return real(pager, slabs, depth)

    monkeypatch.setattr(bp, "pager_slab_rate", spy)
    with open_model(models["qwen3moe"]) as mf:
        every = bp.all_slabs(mf)
    limit = 2 * max(s.nbytes for s in every) + 1
    assert bp.random_slab_rate(models["qwen3moe"], limit, depth=2) > 0
    got = read[-1]
    assert len({s.offset for s in got}) == len(got) >= 3
    assert sum(s.nbytes for s in got[:-1]) < limit <= sum(s.nbytes for s in got)
    assert bp.random_slab_rate(models["qwen3moe"], 1 << 40, seed=3) > 0
    assert sorted(s.offset for s in read[-1]) == sorted(s.offset for s in every)


# ---- split models (llama.cpp's gguf-split parts): one space of offsets over every part ------

@pytest.fixture(scope="module")
def split_model(models, tmp_path_factory):
    """(path of part 2 of 4, the unsplit file) of the qwen3moe fixture, split as gguf-split would."""
    from tests.gguf.split_fixture import split_gguf, tensor_cuts

    src = models["qwen3moe"]
    parts = split_gguf(src, tmp_path_factory.mktemp("pager-split") / "m", tensor_cuts(src, 4))
    return parts[1], src


@pytest.mark.parametrize("mode", MODES)
def test_every_slab_of_a_split_model_equals_its_mapped_bytes(split_model, mode):
    path, src = split_model
    with open_model(path) as mf, open_model(src) as whole, Pager(mf, n_threads=3, **MODES[mode]) as pager:
        assert [(p.path, p.base, p.size) for p in pager.info.parts] == [(str(p.path), p.base, p.size) for p in mf.parts]
        assert pager.info.file_size == mf.file_size and "4 parts" in repr(pager)
        slabs = [mf.expert(layer, e, part) for layer in mf.expert_layers
                 for e in range(mf.hparams.n_experts) for part in PARTS]
        assert len({mf.part_of(s.offset).index for s in slabs}) >= 3  # slabs in parts 2..4 at least
        bufs = [slot_for(pager, s.nbytes) for s in slabs]
        tickets = [pager.submit(s.offset, s.nbytes, b) for s, b in zip(slabs, bufs)]
        for slab, buf, ticket in zip(slabs, bufs, tickets):
            start = pager.wait(ticket)
            got = buf[start:start + slab.nbytes]
            assert np.array_equal(got, mf.expert_data(slab)), slab
            theirs = whole.expert(slab.layer, slab.expert, slab.part)
            assert np.array_equal(got, whole.expert_data(theirs)), slab
        stats = pager.stats()
    assert stats["completed"] == len(slabs) and stats["failed"] == 0
    assert stats["direct"] == (len(slabs) if mode == "direct" else 0)


def test_split_pager_refuses_ranges_outside_one_part(split_model):
    from strata.native._lib import ffi, lib

    path, _ = split_model
    buf = aligned(1 << 20)
    with open_model(path) as mf, Pager(mf) as pager:
        first, second = mf.parts[0], mf.parts[1]
        end = first.base + first.size
        assert second.base > end  # the gap keeps bases aligned
        with pytest.raises(NativeError, match=rf"bytes \[{end - 8}, {end + 8}\): not inside one part: .*00001-of-00004"):
            pager.submit(end - 8, 16, buf)
        with pytest.raises(NativeError, match="not inside one part"):
            pager.submit(end + 1, 4, buf)  # in the gap
        with pytest.raises(NativeError, match="not inside one part"):
            pager.submit(second.base - 4, 8, buf)
        ticket = ffi.new("int64_t *")  # the native check, behind the Python one
        dst = ffi.from_buffer(buf)
        for offset, nbytes in ((end - 8, 16), (end + 1, 4), (second.base - 4, 8), (mf.file_size, 1)):
            assert lib.strata_pager_submit(pager._handle, offset, nbytes, dst, buf.size, ticket) == lib.STRATA_E_SIZE
        start = pager.read(second.base, 64, buf)  # the first bytes of part 2 are its magic
        assert bytes(buf[start:start + 4]) == b"GGUF"


def test_split_pager_open_errors_name_the_part(split_model, tmp_path):
    import types

    path, _ = split_model
    with open_model(path) as mf:
        parts = list(mf.parts)
    missing = types.SimpleNamespace(parts=[parts[0], types.SimpleNamespace(path=tmp_path / "gone.gguf", base=parts[1].base)])
    with pytest.raises(NativeError, match=r"gone.gguf: cannot open for reading: No such file"):
        Pager(missing)
    crowded = types.SimpleNamespace(parts=[parts[0], types.SimpleNamespace(path=parts[1].path, base=parts[0].size - 1)])
    with pytest.raises(NativeError, match=r"00001-of-00004.gguf: part 1 of 2 is larger than the room"):
        Pager(crowded)


def test_split_part_truncated_after_open_names_that_part(split_model, tmp_path):
    import shutil

    path, _ = split_model
    copies = tmp_path / "copy"
    copies.mkdir()
    for p in path.parent.glob("m-0000*-of-00004.gguf"):
        shutil.copyfile(p, copies / p.name)
    with open_model(copies / path.name) as mf, Pager(mf, direct=False) as pager:
        last = mf.parts[-1]
        slab = next(mf.expert(layer, e, part) for layer in reversed(mf.expert_layers)
                    for e in range(mf.hparams.n_experts) for part in PARTS if mf.part_of(mf.expert(layer, e, part).offset) == last)
        os.truncate(last.path, slab.offset - last.base)
        with pytest.raises(NativeError, match=rf"00004-of-00004.gguf: read of bytes .*the file ended early: it is now "
                                              rf"{slab.offset - last.base} bytes, it had {last.size} bytes at open"):
            pager.read(slab.offset, slab.nbytes, aligned(slab.nbytes))
