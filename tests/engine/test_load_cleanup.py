"""A failing `strata.load` leaves no thread, pool or open file behind, whichever step fails."""
from __future__ import annotations

import gc
import os
import time

import pytest

import strata
import strata.engine.build as build
import strata.models.loader as loader
from strata.errors import StrataError
from tests.fixtures.rewrite import V, rewrite
from tests.fixtures.tiny import zoo


def _counts() -> tuple[int, int]:
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def _settled(before: tuple[int, int]) -> tuple[int, int]:
    for _ in range(50):  # worker threads end a moment after they are told to
        gc.collect()
        now = _counts()
        if now == before:
            break
        time.sleep(0.05)
    return now


class _FailingKVCache(build.KVCache):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB")


def _fail_rope(*args, **kwargs):
    raise StrataError("simulated failure while building the layers")


@pytest.fixture(scope="module")
def path():
    p = zoo().get("qwen3moe").gguf(None)
    strata.load(p, threads=2, n_ctx=64).close()  # process-wide pools that outlive every load start now
    strata.load(p, threads=2, n_ctx=64, memory="direct").close()
    return p


@pytest.mark.parametrize("memory, compute, fail", [
    ("tiered", "packed", "kv"), ("tiered", "float", "kv"), ("direct", "packed", "kv"),
    ("tiered", "packed", "layers"), ("direct", "packed", "layers"), ("tiered", "packed", "tokenizer"),
])
def test_failed_load_leaves_nothing_behind(path, tmp_path, monkeypatch, memory, compute, fail):
    target = path
    if fail == "kv":
        monkeypatch.setattr(build, "KVCache", _FailingKVCache)
    elif fail == "layers":
        monkeypatch.setattr(loader, "Rope", _fail_rope)
    else:
        target = rewrite(path, tmp_path / "bad.gguf", {"tokenizer.ggml.eos_token_id": (10**6, V.UINT32)})
    gc.collect()
    before = _counts()
    for _ in range(3):
        with pytest.raises(StrataError) as e:
            strata.load(target, threads=2, n_ctx=64, memory=memory, compute=compute)
        assert str(target) in str(e.value) or fail == "layers"
        del e
    assert _settled(before) == before, "threads and open files (before, after) differ"


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_ctx=0), "^n_ctx: expected an integer >= 2, found 0"),
    (dict(n_ctx=10**12, memory="direct"), "n_ctx=1000000000000 x 4 sequences: the KV cache needs"),
    (dict(threads=0), "^threads: expected an integer >= 1"), (dict(max_batch=0), "^max_batch: expected"),
])
def test_bad_load_arguments(path, kwargs, match):
    before = _counts()
    with pytest.raises(StrataError, match=match):
        strata.load(path, **kwargs)
    assert _settled(before) == before
