"""The shared-memory segment of an expert-parallel group (strata/distributed/shared.py), with a
one-rank stand-in for the group: made and unlinked at once, refused (None: gloo) when the ranks are
on several hosts, when STRATA_EP_SHM=0, or when /dev/shm has no room for it (no file left behind)."""
from __future__ import annotations

import errno
import os

import pytest
import torch

from strata.distributed import shared
from strata.distributed.shared import SharedSums, host_identity


class OneRank:
    """What SharedSums.open asks of an ExpertParallel, for rank 0 of a group of one; `hosts`: what
    the gather of host identities answers."""

    rank, world_size = 0, 1

    def __init__(self, hosts=None):
        self.hosts = hosts

    def gather(self, obj):
        return list(self.hosts) if self.hosts is not None and isinstance(obj, str) else [obj]

    def share(self, obj=None):
        return obj


def _segments() -> set[str]:
    return {p.name for p in shared.SHM_DIR.glob("strata-ep-*")}


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(shared, "SHM_DIR", tmp_path)
    monkeypatch.delenv(shared.ENV, raising=False)
    return tmp_path


def test_segment_made_mapped_and_unlinked(shm_dir):
    sums = SharedSums.open(OneRank(), slot_floats=64)
    assert sums is not None and _segments() == set()  # mapped, and nothing left in the folder
    x, out = torch.randn(64), torch.empty(64)
    sums.seq += 1
    sums.exchange.sum(sums.seq, x, out, 1.0)
    assert torch.equal(out, x)
    sums.close()


def test_ranks_on_two_hosts_or_switched_off_use_gloo(shm_dir, monkeypatch):
    assert SharedSums.open(OneRank(hosts=[host_identity(), "other-host/boot"])) is None
    monkeypatch.setenv(shared.ENV, "0")
    assert SharedSums.open(OneRank()) is None
    assert _segments() == set()


def test_no_room_in_dev_shm_is_gloo_and_no_file(shm_dir, monkeypatch):
    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    assert SharedSums.open(OneRank(), slot_floats=64) is None
    assert _segments() == set()
