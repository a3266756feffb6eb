"""The same-host exchange of partial sums (native/exchange.c): ranks as threads on one anonymous
mapping; sums equal to torch's additions in rank order, bit for bit, over many calls of varying
size; a peer that never publishes is a timeout naming it, one whose process has ended is noticed
at once; bad arguments are refused."""
from __future__ import annotations

import mmap
import subprocess
import sys
import threading
import time

import pytest
import torch

from strata import native
from strata.errors import NativeError

SLOT = 4096


def segment(world: int) -> mmap.mmap:
    return mmap.mmap(-1, native.exchange_bytes(world, SLOT))


@pytest.mark.parametrize("world", [2, 3])
def test_sums_equal_rank_order_additions(world):
    seg = segment(world)
    ranks = [native.Exchange(seg, world, r, SLOT, 1) for r in range(world)]
    g = torch.Generator().manual_seed(world)
    sizes = [1, 7, SLOT, 1024, 0, 333] * 5
    parts = [[torch.randn(n, generator=g) * 10 ** torch.randint(-3, 4, (1,), generator=g).item() for _ in range(world)]
             for n in sizes]
    outs = [[torch.empty(n) for n in sizes] for _ in range(world)]

    def run(r: int) -> None:
        for i, n in enumerate(sizes):
            ranks[r].sum(i + 1, parts[i][r], outs[r][i], timeout_s=30)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i in range(len(sizes)):
        expected = parts[i][0]
        for p in parts[i][1:]:
            expected = expected + p  # the all-gather path's additions
        for r in range(world):
            assert torch.equal(outs[r][i], expected), (i, r)
    for x in ranks:
        x.release()
    seg.close()


def test_a_silent_peer_is_a_timeout_naming_it():
    seg = segment(2)
    me = native.Exchange(seg, 2, 0, SLOT, 1)
    native.Exchange(seg, 2, 1, SLOT, 1).release()  # rank 1 joins (pid 1: alive) and never publishes
    t0 = time.monotonic()
    with pytest.raises(native.ExchangeError) as info:
        me.sum(1, torch.ones(4), torch.empty(4), timeout_s=0.3)
    assert info.value.late == 1 and not info.value.ended and "did not answer within 0.3 s" in str(info.value)
    assert 0.3 <= time.monotonic() - t0 < 5


def test_a_peer_whose_process_ended_is_noticed_before_the_timeout():
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = int(done.stdout)  # reaped: /proc has no entry for it
    seg = segment(3)
    me = native.Exchange(seg, 3, 0, SLOT, 1)
    native.Exchange(seg, 3, 1, SLOT, gone).release()
    native.Exchange(seg, 3, 2, SLOT, 1).release()
    t0 = time.monotonic()
    with pytest.raises(native.ExchangeError) as info:
        me.sum(1, torch.ones(4), torch.empty(4), timeout_s=60)
    assert info.value.late == 1 and info.value.ended and "has ended" in str(info.value)
    assert time.monotonic() - t0 < 5


def test_bad_arguments_are_refused():
    seg = segment(2)
    x = native.Exchange(seg, 2, 0, SLOT, 1)
    with pytest.raises(NativeError):
        x.sum(0, torch.ones(4), torch.empty(4), 1.0)  # sequence numbers start at 1
    with pytest.raises(NativeError):
        x.sum(1, torch.ones(SLOT + 1), torch.empty(SLOT + 1), 1.0)  # beyond a slot
    with pytest.raises(ValueError):
        x.sum(1, torch.ones(4), torch.empty(5), 1.0)
    with pytest.raises(NativeError):
        native.Exchange(seg, 2, 2, SLOT, 1)  # no rank 2 of 2
    with pytest.raises(NativeError):
        native.Exchange(mmap.mmap(-1, 4096), 2, 0, SLOT, 1)  # shorter than the layout
    with pytest.raises(ValueError):
        native.exchange_bytes(0, SLOT)
    x.release()
