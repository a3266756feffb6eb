"""Where experts start and where reads will come from, before anything loads: the placement
estimate, `strata inspect --placement`, and the one-line warning when most experts would come
from the disk."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import strata
from converters import TypePolicy, convert
from strata.cli import main
from strata.errors import SlowPathWarning
from strata.gguf import open_model
from strata.gguf.routing import save_routing_npz
from strata.memory.budget import host_budget_for_slots
from strata.memory.placement import estimate
from strata.synth import build_checkpoint

from .tiered_fixture import N_EXPERTS, N_LAYERS, TOP_K, budgets, moe_file


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """The tiered fixture's model with routing statistics: layer l's expert e was used (e + 1) * (l + 1)
    times, reversed in odd layers."""
    root = tmp_path_factory.mktemp("placement")
    hf = build_checkpoint(root / "hf", seed=3, num_hidden_layers=N_LAYERS, num_experts=N_EXPERTS,
                          num_experts_per_tok=TOP_K)
    counts = np.array([[(e + 1) * (layer + 1) for e in range(N_EXPERTS)] for layer in range(N_LAYERS)], dtype=float)
    counts[1::2] = counts[1::2, ::-1]
    save_routing_npz(root / "routing.npz", counts, 100)
    out = root / "seeded.gguf"
    convert(hf, out, TypePolicy(), n_threads=2, routing_stats=root / "routing.npz")
    return out, counts


def test_uniform_estimate_without_statistics():
    with open_model(moe_file()) as mf:
        p = estimate(mf, 2, 4)
        slab = sum(s.nbytes for s in mf.expert_slabs(mf.expert_layers[0], 0))
    assert p.source == "uniform routing" and p.layers == []
    assert (p.device_share, p.host_share, p.disk_share) == pytest.approx((2 / 8, 2 / 8, 4 / 8))
    assert p.disk_bytes_per_token == pytest.approx(0.5 * TOP_K * N_LAYERS * slab)
    with open_model(moe_file()) as mf:
        assert estimate(mf, 8, 8).disk_share == 0 and estimate(mf, 8, 2).device_share == 1


def test_statistics_put_each_layers_hottest_experts_first(seeded):
    path, counts = seeded
    with open_model(path) as mf:
        p = estimate(mf, 2, 3)
    assert p.source == "routing statistics"
    assert p.layers[0]["device"] == [6, 7] and p.layers[0]["host"] == [5]
    assert p.layers[1]["device"] == [0, 1] and p.layers[1]["host"] == [2]
    share = counts / counts.sum(axis=1, keepdims=True)
    dev = np.mean([np.sort(s)[::-1][:2].sum() for s in share])
    host = np.mean([np.sort(s)[::-1][2] for s in share])
    assert (p.device_share, p.host_share, p.disk_share) == pytest.approx((dev, host, 1 - dev - host))


def test_inspect_placement_text_and_json(seeded, capsys):
    """On the CPU with packed compute the paged memory runs: the table is its one pool of RAM slots
    (slots per layer, budget, the hottest experts resident at start, the rest read from the disk)."""
    path, counts = seeded
    _, host = budgets(path, "packed", host_slots=3)
    assert main(["inspect", str(path), "--placement", "--json", "--host-mem", str(host), "--ctx", "64"]) == 0
    got = json.loads(capsys.readouterr().out)["placement"]
    assert got["memory"] == "paged" and got["slot_form"] == "packed" and got["ram_budget_bytes"] == host
    assert got["ram_slots_per_layer"] == 3 and got["estimate_from"] == "routing statistics"
    assert "device_slots_per_layer" not in got and "host_slots_per_layer" not in got
    assert got["layers"][0]["ram"] == [5, 6, 7] and got["layers"][1]["ram"] == [0, 1, 2]
    share = counts / counts.sum(axis=1, keepdims=True)
    ram = np.mean([np.sort(s)[::-1][:3].sum() for s in share])
    assert (got["expected_share"]["ram"], got["expected_share"]["disk"]) == pytest.approx((ram, 1 - ram))
    assert main(["inspect", str(path), "--placement", "--host-mem", str(host), "--ctx", "64"]) == 0
    text = capsys.readouterr().out
    assert "placement on cpu (packed compute, paged memory: one pool of RAM slots, budget" in text
    assert "per layer 3/8 experts in RAM slots, the rest read from the disk on demand" in text
    assert "expected share of expert reads (routing statistics): RAM" in text and "host" not in text.split("placement on")[1].split("runtime")[0]
    assert "layer 0: RAM [5, 6, 7] at start, the rest on the disk" in text
    # what runs each step as `strata generate` loads it: the same memory the table describes
    assert got["runtime"]["memory"]["runner"] == "paged"
    assert got["runtime"]["decode"]["runner"] == "program" and got["runtime"]["prefill"]["runner"] == "packed per-call"
    assert "runtime: decode: program; prefill: packed per-call; hybrid: off; memory: paged — why: decode: every " \
           "block fused" in text


def test_inspect_placement_of_memory_tiered_on_packed_compute_is_the_paged_pool(seeded, capsys):
    """--device-mem asks for the tiered memory; with packed compute on the CPU the paged memory serves it
    with host_mem plus device_mem less the resident weights and KV cache, and the table says so."""
    path, _ = seeded
    _, host = budgets(path, "packed", host_slots=2)
    args = ["inspect", str(path), "--placement", "--json", "--ctx", "64", "--host-mem", str(host)]
    assert main(args + ["--device-mem", "1G"]) == 0
    got = json.loads(capsys.readouterr().out)["placement"]
    assert got["memory"] == "paged" and got["ram_slots_per_layer"] == N_EXPERTS  # 1G less the reserved holds all
    assert got["expected_share"]["disk"] == 0 and got["runtime"]["memory"]["runner"] == "paged"


def test_inspect_placement_with_float_compute_is_the_tiered_table(seeded, capsys):
    path, _ = seeded
    _, host = budgets(path, "packed", host_slots=3)
    args = ["inspect", str(path), "--placement", "--ctx", "64", "--host-mem", str(host), "--compute", "float"]
    assert main(args + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)["placement"]
    assert got["memory"] == "tiered" and got["host_slots_per_layer"] == 3
    assert got["device_slots_per_layer"] == N_EXPERTS  # the default CPU budget holds every expert
    assert got["layers"][0]["device"] == list(range(N_EXPERTS)) and got["expected_share"]["disk"] == 0
    assert got["runtime"]["memory"]["runner"] == "tiered"
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "placement on cpu (float compute, tiered memory, dequantized slots): per layer 8/8 experts in RAM slots, " \
           "3/8 in host RAM" in text
    assert "layer 0: RAM [0, 1, 2, 3, 4, 5, 6, 7], host [] at start" in text


def _tight(path, n_ctx: int) -> tuple[int, int]:
    """(device_mem, host_mem) for strata.load with float compute and packed slots: 2 device and 2
    host slots per layer, resident weights and the KV cache of one n_ctx sequence included."""
    import torch

    from strata.engine.kv_cache import KVCache
    from strata.memory.budget import device_budget_for_slots, resident_bytes
    from strata.memory.device import expert_geometry

    with open_model(path) as mf:
        hp = mf.hparams
        reserved = resident_bytes(mf, torch.float32) + KVCache.bytes_for(
            hp.n_layers, 1, n_ctx, hp.n_head_kv, hp.head_dim, hp.head_dim_v)
        dev = device_budget_for_slots(expert_geometry(mf), "packed", torch.float32, "cpu", len(mf.expert_layers), 2,
                                      TOP_K, reserved=reserved)
    return dev, budgets(path, "packed", host_slots=2)[1]


def test_slow_path_warns_once_at_load(capsys):
    path = moe_file()
    dev, host = _tight(path, 64)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with strata.load(path, threads=1, n_ctx=64, max_batch=1, compute="float", slot_form="packed",
                         device_mem=dev, host_mem=host) as m:  # the tiered memory
            assert (m.memory.plan.slots_per_layer, m.memory.host.slots_per_layer) == (2, 2)
        with strata.load(path, threads=1, n_ctx=64):  # the default budgets hold every expert: no warning
            pass
    slow = [w for w in seen if issubclass(w.category, SlowPathWarning)]
    assert len(slow) == 1 and "75% of expert reads will come from the disk" in str(slow[0].message)
    assert str(path) in str(slow[0].message) and "--host-mem" in str(slow[0].message)
    code = main(["generate", str(path), "-p", "x", "-n", "2", "--threads", "1", "--ctx", "64",
                 "--compute", "float", "--slot-form", "packed", "--device-mem", str(dev), "--host-mem", str(host)])
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("strata: warning:")]
    assert code == 0 and len(lines) == 1 and "from the disk" in lines[0]
    assert "SlowPathWarning" not in err  # one line, not Python's warning format


def test_paged_memory_warns_once_in_its_own_words(capsys):
    path = moe_file()
    with open_model(path) as mf:
        host = host_budget_for_slots(mf, TOP_K)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with strata.load(path, threads=1, n_ctx=64, max_batch=1, memory="paged", host_mem=host) as m:
            assert m.memory.max_acquire == TOP_K < N_EXPERTS
    slow = [str(w.message) for w in seen if issubclass(w.category, SlowPathWarning)]
    assert len(slow) == 1 and f"{TOP_K}/{N_EXPERTS} experts in RAM" in slow[0], slow
    assert "--host-mem" in slow[0] and "--device-mem" not in slow[0]
