"""Configuration as data: MemoryConfig and SamplingParams, each checked in one place.

Every spelling (the object, a kind's name, keyword sugar; in the API, the CLI and the server)
builds the same config and the same logits and tokens; every refusal is one line that names the
option, what was expected and what was found, in the same words wherever it comes from.
"""
from __future__ import annotations

import re

import pytest
import torch

import strata
from strata.cli import main
from strata.engine import MemoryConfig, SamplingParams
from strata.engine.build import memory_config_for as _memory_config
from strata.engine.config import OptionError, memory_config
from strata.errors import StrataArgumentError, StrataError
from strata.memory.budget import TieredConfig
from strata.server.errors import APIError
from strata.server.protocol import parse_chat, parse_completion
from tests.fixtures.tiny import zoo

GIB = 1 << 30


@pytest.fixture(scope="module")
def path():
    return zoo().get("qwen3moe").gguf(None)


# -- MemoryConfig ----------------------------------------------------------------------------------

@pytest.mark.parametrize("memory, options, want", [
    (MemoryConfig("paged", host_mem=GIB), {}, MemoryConfig("paged", host_mem=GIB)),
    ("paged", {"host_mem": "1G"}, MemoryConfig("paged", host_mem=GIB)),
    (None, {"host_mem": "1GiB"}, MemoryConfig("paged", host_mem=GIB)),  # packed compute: paged by default
    (None, {"prefetch_depth": 0}, MemoryConfig("tiered", prefetch_depth=0)),  # a tiered-only option: tiered
    ("tiered", {"device_mem": "512M", "slot_form": "packed"}, MemoryConfig("tiered", device_mem=512 << 20,
                                                                           slot_form="packed")),
    (MemoryConfig(device_mem="2G"), {}, MemoryConfig("tiered", device_mem=2 * GIB)),
    ("direct", {}, MemoryConfig("direct")),
])
def test_every_spelling_builds_the_same_config(memory, options, want):
    assert _memory_config(memory, options, "packed")[0] == want


def test_kind_is_chosen_by_the_compute_mode():
    assert MemoryConfig().resolved("packed") == MemoryConfig("paged")
    assert MemoryConfig().resolved("float") == MemoryConfig("tiered")
    assert MemoryConfig(host_mem=GIB).resolved("float") == MemoryConfig("tiered", host_mem=GIB)
    assert MemoryConfig("tiered", prefetch_depth=0, hybrid=True).to_tiered() == \
        TieredConfig(prefetch_depth=0, hybrid=True)


@pytest.mark.parametrize("options, words", [
    (dict(kind="paged", device_mem="1G"), "device_mem: options of memory='tiered', not of memory='paged' "
                                          "(its options: host_mem, miss_stand_in, stand_in_mode)"),
    (dict(kind="direct", host_mem="1G", prefetch_depth=1), "host_mem, prefetch_depth: options of memory='tiered', "
                                                           "not of memory='direct' (its options: none)"),
    (dict(kind="disk"), "memory: expected one of 'tiered', 'paged', 'direct', found 'disk'"),
    (dict(prefetch_depth=-1), "prefetch_depth: expected an integer >= 0, found -1"),
    (dict(prefetch_depth=True), "prefetch_depth: expected an integer >= 0, found True"),
    (dict(host_mem="0"), "host_mem: expected a positive number of bytes such as 512M or 8G, found '0'"),
    (dict(device_mem="lots"), "device_mem: expected a positive number of bytes such as 512M or 8G, found 'lots'"),
    (dict(slot_form="float"), "slot_form: expected one of 'dequantized', 'packed', found 'float'"),
    (dict(hybrid="yes"), "hybrid: expected True or False, found 'yes'"),
])
def test_memory_refusals_are_one_line_naming_the_option(options, words):
    with pytest.raises(OptionError) as info:
        MemoryConfig(**options)
    assert str(info.value) == words and "\n" not in words
    assert info.value.option in (*options, "kind")


def test_memory_config_and_loose_options_or_a_factory_with_options_are_refused():
    with pytest.raises(StrataArgumentError, match="^host_mem: give the expert memory's options in the MemoryConfig"):
        memory_config(MemoryConfig("paged"), {"host_mem": GIB})
    with pytest.raises(StrataArgumentError, match="options of a MemoryConfig, not of a memory factory"):
        _memory_config(lambda *a: None, {"host_mem": GIB}, "packed")
    with pytest.raises(StrataArgumentError, match="^memory: expected a MemoryConfig"):
        memory_config(3, {})
    with pytest.raises(TypeError, match="unexpected keyword argument 'ctx'"):
        strata.load("nowhere.gguf", ctx=64)


def test_memory_refusals_come_before_the_file_is_opened():
    """A bad option is an argument error, not a missing file."""
    with pytest.raises(StrataArgumentError, match="device_mem: options of memory='tiered', not of memory='paged'"):
        strata.load("nowhere.gguf", memory="paged", device_mem="1G")
    with pytest.raises(StrataArgumentError, match="memory='paged' serves packed compute"):
        strata.load("nowhere.gguf", memory=MemoryConfig("paged"), compute="float")
    with pytest.raises(StrataError, match="slot_form='dequantized': with packed compute on the CPU the paged memory "
                                          "serves memory='tiered': packed compute reads packed slots"):
        strata.load("nowhere.gguf", memory=MemoryConfig(slot_form="dequantized"), compute="packed")


def test_the_tiered_budgets_on_the_cpu_with_packed_compute_are_the_paged_memorys(path):
    """There the tiered memory's two tiers would both be RAM: the paged memory serves it, its one
    budget host_mem plus device_mem less the resident weights and KV cache (which device_mem covers)."""
    from strata.engine.kv_cache import KVCache
    from strata.gguf import open_model
    from strata.memory.budget import resident_bytes
    from strata.models import cache_dims

    with strata.load(path, threads=1, n_ctx=64, memory="paged", host_mem="64M") as paged, \
            strata.load(path, threads=1, n_ctx=64, memory="tiered", host_mem="64M", slot_form="packed") as tiered:
        assert type(tiered.memory).__name__ == "PagedExpertMemory" == type(paged.memory).__name__
        assert tiered.memory.host.budget == paged.memory.host.budget == 64 << 20
        assert torch.equal(tiered.logits([1, 5, 9]), paged.logits([1, 5, 9]))
    with open_model(path) as mf:
        reserved = resident_bytes(mf, torch.float32, "packed") + KVCache.bytes_for(
            mf.hparams.n_layers, 1, 64, *cache_dims(mf.hparams), torch.float32)
    with strata.load(path, threads=1, n_ctx=64, max_batch=1, memory="tiered", device_mem=reserved + (32 << 20),
                     host_mem="16M") as m:
        assert m.memory.host.budget == (32 << 20) + (16 << 20) and m.plan.memory == "paged"
    config = MemoryConfig("tiered", device_mem="96M", host_mem="32M")
    assert config.backend("packed") == "paged" and config.backend("float") == "tiered"
    assert config.ram_budget(reserved=16 << 20) == 112 << 20
    assert MemoryConfig("tiered", device_mem="96M").ram_budget(reserved=16 << 20) == 80 << 20
    with pytest.raises(StrataArgumentError, match=r"^device_mem=1048576: the resident weights and KV cache take "
                                                  r"2097152 bytes of it, nothing is left for experts"):
        MemoryConfig(device_mem="1M").ram_budget(reserved=2 << 20)


@pytest.mark.parametrize("option, value, words", [
    ("prefetch_depth", 1, "the paged memory reads experts on demand, without prefetch"),
    ("slot_form", "dequantized", "packed compute reads packed slots"),
    ("hybrid", True, "packed compute already runs every expert on the CPU"),
])
def test_tiered_options_the_paged_memory_cannot_honour_are_refused(option, value, words):
    """On the CPU with packed compute, before the file is opened; float compute keeps the tiered memory."""
    with pytest.raises(OptionError, match=rf"^{option}={value!r}: with packed compute on the CPU the paged memory "
                                          rf"serves memory='tiered': {words}.*compute='float'"):
        strata.load("nowhere.gguf", memory="tiered", **{option: value})
    assert getattr(_memory_config("tiered", {option: value}, "float")[0].to_tiered(), option) == value


@pytest.mark.parametrize("spellings", [
    [dict(memory=MemoryConfig("paged", host_mem="64M")), dict(memory="paged", host_mem=64 << 20)],
    # (host_mem alone, 64M holding every expert of a file in the page cache: the direct memory, test_memory_choice.py)
    [dict(memory=MemoryConfig("tiered", prefetch_depth=0, slot_form="packed")),
     dict(memory="tiered", prefetch_depth=0, slot_form="packed"), dict(prefetch_depth=0, slot_form="packed")],
])
def test_every_spelling_loads_the_same_memory_and_logits(path, spellings):
    ids = [1, 5, 9, 13, 2, 7]
    seen = []
    for kw in spellings:
        with strata.load(path, threads=1, n_ctx=64, **kw) as m:
            config = getattr(m.memory, "config", None)
            seen.append((type(m.memory).__name__, config, m.logits(ids)))
    for kind, config, logits in seen[1:]:
        assert (kind, config) == seen[0][:2]
        assert torch.equal(logits, seen[0][2])


# -- SamplingParams --------------------------------------------------------------------------------

def test_sampling_object_keywords_and_load_default_agree(path):
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=5, max_tokens=6, stop_token_ids=())
    keywords = dict(temperature=0.9, top_k=20, top_p=0.9, seed=5, max_tokens=6, stop_token_ids=[])
    with strata.load(path, threads=1, n_ctx=64) as m, \
            strata.load(path, threads=1, n_ctx=64, sampling=params) as d:
        assert m.sampling_params(**keywords) == params
        want = m.generate("the expert", sampling=params).token_ids
        assert len(want) == 6
        assert m.generate("the expert", **keywords).token_ids == want
        assert d.generate("the expert").token_ids == want  # load's default
        assert d.generate("the expert", max_tokens=3).token_ids == want[:3]  # keywords over the default
        assert [c.token_ids for c in m.generate_batch(["the expert", "a router"], sampling=params)][0] == want
        with pytest.raises(StrataArgumentError, match="^top_k: give the sampling options in sampling="):
            m.generate("x", sampling=params, top_k=3)
        with pytest.raises(TypeError, match="'temp'"):
            m.generate("x", temp=0.5)
        with pytest.raises(StrataArgumentError, match="^top_p: expected a finite number > 0 and <= 1, found 0"):
            m.generate("x", top_p=0)
        with pytest.raises(StrataArgumentError, match="^sampling: expected a SamplingParams"):
            m.generate("x", sampling={"temperature": 1.0})


def test_sampling_normalises_its_stop_rules():
    p = SamplingParams(stop="END", stop_token_ids=[3, 3, 4])
    assert p.stop == ("END",) and p.stop_token_ids == frozenset({3, 4}) and p == SamplingParams(stop=["END"],
                                                                                             stop_token_ids={3, 4})
    assert hash(p) == hash(SamplingParams(stop=("END",), stop_token_ids=(4, 3)))
    with pytest.raises(OptionError, match="^stop_token_ids: expected token ids"):
        SamplingParams(stop_token_ids=[-1])
    with pytest.raises(OptionError, match="^max_tokens: expected an integer >= 1, found 0"):
        SamplingParams(max_tokens=0)


# -- the same words from the CLI and the server --------------------------------------------------

#: (field, server value, CLI flag, CLI value): bad values both front ends can carry (the CLI's float
#: flags parse as floats: -1.0 in JSON).
BAD = [("temperature", -1.0, "--temperature", "-1"), ("top_p", 0.0, "--top-p", "0"), ("top_p", 2.0, "--top-p", "2"),
       ("min_p", 1.5, "--min-p", "1.5"), ("repetition_penalty", 0.0, "--repeat-penalty", "0"),
       ("top_k", -2, "--top-k", "-2"), ("seed", -1, "--seed", "-1"), ("seed", 2**70, "--seed", str(2**70)),
       ("max_tokens", 0, "-n", "0"), ("stop", [""], "--stop", "")]


@pytest.mark.parametrize("field, value, flag, text", BAD)
def test_cli_and_server_refuse_the_same_values_in_the_same_words(capsys, path, field, value, flag, text):
    with pytest.raises(APIError) as info:
        parse_completion({"prompt": "x", field: value})
    server = info.value
    assert server.status == 400 and server.param == field
    assert main(["generate", str(path), "-p", "Hello", flag, text]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("strata: error: "), lines
    cli = lines[0].removeprefix("strata: error: ")
    cli_flag = "-n/--max-tokens" if flag == "-n" else flag
    assert cli.startswith(cli_flag + ": ") and str(server).startswith(field + ": ")
    assert cli.removeprefix(cli_flag) == str(server).removeprefix(field)  # the words after the name
    with pytest.raises(StrataArgumentError) as api:
        SamplingParams(**{field: value})
    assert str(api.value) == str(server)


def test_server_names_the_field_it_was_given():
    with pytest.raises(APIError) as info:
        parse_chat({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0, "max_tokens": 5})
    assert info.value.param == "max_completion_tokens"
    assert str(info.value).startswith("max_completion_tokens: expected an integer >= 1, found 0")
    req = parse_completion({"prompt": "x", "ignore_eos": True, "top_k": -1, "max_tokens": 3})
    assert req.sampling == SamplingParams(top_k=0, max_tokens=3, stop_token_ids=())  # the rest: the API's defaults


@pytest.mark.parametrize("args, api", [
    (["--memory", "paged", "--device-mem", "64M"], dict(memory="paged", device_mem="64M")),
    (["--memory", "direct", "--prefetch-depth", "1"], dict(memory="direct", prefetch_depth=1)),
    (["--prefetch-depth", "-1"], dict(prefetch_depth=-1)),
    (["--slot-form", "packed", "--host-mem", "0"], dict(slot_form="packed", host_mem="0")),
])
def test_cli_and_api_refuse_memory_options_in_the_same_words(capsys, path, args, api):
    assert main(["generate", str(path), "-p", "Hello", *args]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    with pytest.raises(StrataArgumentError) as info:
        strata.load(path, **api)
    flags = {"device_mem": "--device-mem", "host_mem": "--host-mem", "prefetch_depth": "--prefetch-depth",
             "slot_form": "--slot-form", "miss_stand_in": "--miss-stand-in", "stand_in_mode": "--stand-in-mode"}
    words = re.sub(r"memory='(\w+)'", r"--memory \1", str(info.value))  # the API's spelling of a kind, the CLI's
    for k, v in flags.items():
        words = words.replace(k, v)
    assert lines[0] == "strata: error: " + words
