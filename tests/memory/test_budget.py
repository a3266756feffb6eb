"""Budgets: the machine's memory under a memory cgroup (v2 and v1, read from fake files), and the
default budgets that follow from it: the budgets take the measured `Machine` as data, and a load
measures once."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from strata.gguf import open_model
from strata.memory import budget, machine
import strata
from strata.memory.budget import (DEFAULT_CPU_DEVICE_FRACTION, DEFAULT_HOST_FRACTION, DEFAULT_PREFETCH_MARGIN,
                                  BudgetError, TieredConfig, check_host_budget, default_host_budget, make_plan,
                                  paged_budget, slot_layout)
from strata.memory.machine import Machine, cgroup_memory, machine_memory
from strata.memory.device import expert_geometry
from strata.memory.host import HostTier
from strata.memory.policy import PolicyConfig

from .tiered_fixture import moe_file

GIB, MIB = 1 << 30, 1 << 20


def _fake_machine(tmp_path: Path, monkeypatch, cgroup_lines: str, files: dict[str, str],
                  total: int = 64 * GIB, available: int = 48 * GIB) -> None:
    """Point `machine` at a fake /proc/meminfo, /proc/self/cgroup and cgroup tree under tmp_path."""
    (tmp_path / "meminfo").write_text(f"MemTotal: {total // 1024} kB\nMemFree: 1 kB\n"
                                      f"MemAvailable: {available // 1024} kB\n")
    (tmp_path / "cgroup").write_text(cgroup_lines)
    root = tmp_path / "sys"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.setattr(machine, "MEMINFO", str(tmp_path / "meminfo"))
    monkeypatch.setattr(machine, "PROC_CGROUP", str(tmp_path / "cgroup"))
    monkeypatch.setattr(machine, "CGROUP_ROOT", str(root))


def test_without_a_cgroup_limit_the_machine_is_meminfo(tmp_path, monkeypatch):
    _fake_machine(tmp_path, monkeypatch, "0::/user.slice\n", {"user.slice/memory.max": "max\n"})
    assert cgroup_memory() is None
    assert machine_memory() == (64 * GIB, 48 * GIB)
    _fake_machine(tmp_path, monkeypatch, "4:memory:/job\n",  # v1 says "no limit" with a huge number
                  {"memory/job/memory.limit_in_bytes": "9223372036854771712\n"})
    assert machine_memory() == (64 * GIB, 48 * GIB)


def test_cgroup_v2_limit_of_an_ancestor_bounds_the_machine(tmp_path, monkeypatch):
    _fake_machine(tmp_path, monkeypatch, "0::/pod/job\n", {
        "pod/job/memory.max": "max\n",
        "pod/memory.max": f"{2 * GIB}\n", "pod/memory.current": f"{512 * MIB}\n",
        "pod/memory.stat": f"anon 1\ninactive_file {128 * MIB}\nactive_file 5\n",
        "memory.max": f"{8 * GIB}\n"})  # a looser limit higher up does not win
    assert cgroup_memory() == (2 * GIB, 2 * GIB - 512 * MIB + 128 * MIB)
    assert machine_memory() == (2 * GIB, 2 * GIB - 384 * MIB)


def test_cgroup_v1_memory_controller(tmp_path, monkeypatch):
    _fake_machine(tmp_path, monkeypatch, "5:cpu,cpuacct:/x\n4:memory:/docker/abc\n1:name=systemd:/y\n", {
        "memory/docker/abc/memory.limit_in_bytes": f"{GIB}\n",
        "memory/docker/abc/memory.usage_in_bytes": f"{300 * MIB}\n",
        "memory/docker/abc/memory.stat": f"cache 9\ntotal_inactive_file {100 * MIB}\n"})
    assert machine_memory() == (GIB, GIB - 200 * MIB)
    # MemAvailable below the cgroup's headroom stays the bound
    _fake_machine(tmp_path, monkeypatch, "4:memory:/docker/abc\n",
                  {"memory/docker/abc/memory.limit_in_bytes": f"{GIB}\n"}, available=256 * MIB)
    assert machine_memory() == (GIB, 256 * MIB)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_default_budgets_fit_inside_the_cgroup(tmp_path, monkeypatch, version):
    """Under a memory cgroup of B bytes on a 64 GiB machine, the default device and host budgets
    together come to at most B; from /proc/meminfo alone they would take far more."""
    B = 24 * MIB
    path = moe_file()
    with open_model(path) as mf:
        geometry = expert_geometry(mf)
        _fake_machine(tmp_path, monkeypatch, "0::/\n", {})
        unlimited = make_plan(mf, geometry, torch.device("cpu"), torch.float32, machine=Machine.measure())
        assert unlimited.device_budget == 12 * GIB  # a quarter of the fake 48 GiB available
        if version == "v2":
            _fake_machine(tmp_path, monkeypatch, "0::/job\n", {"job/memory.max": f"{B}\n"})
        else:
            _fake_machine(tmp_path, monkeypatch, "7:memory:/job\n", {"memory/job/memory.limit_in_bytes": f"{B}\n"})
        plan = make_plan(mf, geometry, torch.device("cpu"), torch.float32, machine=Machine.measure())
        assert plan.device_budget + plan.host_budget <= B
        assert plan.device_budget == B // 4 and plan.host_budget <= int(B * DEFAULT_HOST_FRACTION)
        with HostTier(mf, n_threads=1) as host:  # the host tier's own default is the same one
            assert host.budget <= int(B * DEFAULT_HOST_FRACTION) and host.pool.nbytes <= host.budget


def test_one_default_for_each_setting():
    assert TieredConfig().prefetch_margin == PolicyConfig().prefetch_margin == DEFAULT_PREFETCH_MARGIN
    assert budget.DEFAULT_HOST_FRACTION == budget.DEFAULT_CPU_DEVICE_FRACTION == 0.25  # README: a quarter each


def test_budgets_take_the_machine_as_data():
    """No fake files: a `Machine` record of chosen figures decides every default and check."""
    with open_model(moe_file()) as mf:
        geometry, layout = expert_geometry(mf), slot_layout(mf, 4096)
        L, E, k = len(mf.expert_layers), mf.hparams.n_experts, mf.hparams.n_experts_used
        big, small = Machine.cpu(64 * GIB, 48 * GIB), Machine.cpu(64 * GIB, MIB)
        assert make_plan(mf, geometry, torch.device("cpu"), torch.float32, machine=big).device_budget == 12 * GIB
        assert default_host_budget(mf, layout, big) == L * E * layout.slot_bytes  # capped at every expert
        assert default_host_budget(mf, layout, small) == L * k * layout.slot_bytes  # raised to top-k per layer
        share = int(4 * MIB * (DEFAULT_CPU_DEVICE_FRACTION + DEFAULT_HOST_FRACTION)) - MIB
        assert paged_budget(mf, Machine.cpu(GIB, 4 * MIB), reserved=MIB) == max(
            L * k * layout.slot_bytes, min(L * E * layout.slot_bytes, share))
        with pytest.raises(BudgetError, match=r"larger than this machine's RAM \(2.0 MiB\)"):
            check_host_budget(3 * MIB, mf, layout, k, Machine.cpu(2 * MIB, MIB))
        with pytest.raises(BudgetError, match=r"larger than the cuda:0's memory \(1.00 GiB\)"):
            make_plan(mf, geometry, torch.device("cuda:0"), torch.float32, machine=Machine(big.ram, (GIB, GIB)),
                      device_mem=2 * GIB)


@pytest.mark.filterwarnings("ignore::strata.errors.SlowPathWarning")  # 2 of 8 experts in RAM: the point
@pytest.mark.parametrize("memory, compute, available", [("paged", "packed", 2 * MIB), ("tiered", "float", 48 * GIB)])
def test_a_load_measures_the_machine_once_and_hands_it_down(monkeypatch, memory, compute, available):
    """strata.load reads the machine's memory once; the memory's default budgets start from that
    record: the paged memory's falls to top-k slots per layer on 2 MiB, the tiered memory's device
    budget is a quarter of what is available."""
    calls = []

    def fake():
        calls.append(1)
        return 64 * GIB, available

    monkeypatch.setattr(machine, "machine_memory", fake)
    with strata.load(moe_file(), memory=memory, compute=compute, threads=1, n_ctx=32, max_batch=1) as m:
        if memory == "paged":
            assert m.memory.host.slots_per_layer == m.hparams.n_experts_used
        else:
            assert m.memory.plan.device_budget == int(available * DEFAULT_CPU_DEVICE_FRACTION)
    assert len(calls) == 1
