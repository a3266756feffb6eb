"""Words that fit the machine: on the CPU the fast tier is RAM, so --stats, `bench` and `inspect
--placement` speak of "RAM slots" and "RAM hits"; on a GPU of "device slots" and "device hits".
The wording is chosen by the commands' formatter (strata.commands.tiers) from the device."""
from __future__ import annotations

import json

import pytest

from strata.commands.bench import format_model, format_tiered
from strata.commands.tiers import fast_tier, format_memory_stats
from strata.memory import MemoryStats


def _stats() -> MemoryStats:
    s = MemoryStats([0, 1], n_experts=4)
    s.requests[:] = [10, 6]
    s.device_hits[:] = [7, 3]
    s.device_misses[:] = [3, 3]
    s.disk_reads[:] = [3, 3]
    return s


@pytest.mark.parametrize("device, fast, other", [("cpu", "RAM", "device"), ("cuda:0", "device", "RAM")])
def test_memory_stats_words_follow_the_device(device, fast, other):
    text = format_memory_stats(_stats(), device)
    assert fast_tier(device) == fast
    assert f"16 expert requests: {fast} hits 10 (62.5%)" in text and f"host -> {fast} slots" in text
    assert f"{other} hits" not in text and f"{other} slots" not in text
    assert ("ram.hit" if fast == "RAM" else "dev.hit") in text.splitlines()[4]
    assert text.splitlines()[5].split()[:3] == ["0", "10", "7"]


def test_generate_stats_on_the_cpu_say_ram(cli, qwen3):
    code, _, err = cli("generate", qwen3.gguf(None), "-p", "the router", "-n", "4", "--threads", "1", "--stats",
                       "--memory", "tiered", "--host-mem", "1M")
    assert code == 0, err
    assert "RAM hits" in err and "host -> RAM slots" in err and "ram.hit" in err
    assert "device hit" not in err and "device slot" not in err and "dev.hit" not in err


def test_inspect_placement_on_the_cpu_says_ram(cli, qwen3):
    code, out, err = cli("inspect", qwen3.gguf(None), "--placement", "--ctx", "64")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("placement on cpu"))
    assert "experts in RAM slots" in line and "on the device" not in line and "reads (uniform routing): RAM " in line


def test_bench_tables_say_ram_on_the_cpu_and_device_on_cuda(cli, qwen3):
    code, out, err = cli("bench", "tiered", qwen3.gguf(None), "--tokens", "3", "--depths", "0", "--threads", "1",
                         "--ctx", "32", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["device"] == "cpu"
    text = format_tiered(r)
    assert " RAM / " in text.splitlines()[0] and "ram.hit" in text and "dev.hit" not in text
    assert " device / " in format_tiered({**r, "device": "cuda:0"}).splitlines()[0]
    code, out, err = cli("bench", qwen3.gguf(None), "-p", "4", "-n", "3", "--reps", "1", "--threads", "1",
                         "--memory", "tiered", "--json")
    assert code == 0, err
    m = json.loads(out)
    assert "RAM hit rate" in format_model(m) and "into RAM slots" in format_model(m)
    assert "device hit rate" in format_model({**m, "device": "cuda:0"})
