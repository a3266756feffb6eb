"""A split model runs as its unsplit file does: the logits of every expert memory (direct, paged,
tiered at a pressure that reads experts from every part) through the packed and the float paths
are identical, bit for bit, to the unsplit file's; so is the start-up placement from the routing
statistics in the first part, and `strata inspect --placement`. Both kinds of parts are held to
it: Strata's converter's (`split_max_size`) and gguf-split's (written by tests/gguf/split_fixture)."""
from __future__ import annotations

import io
import json
import types

import numpy as np
import pytest
import torch

import strata
from converters import TypePolicy, convert
from strata.commands import inspect as inspect_cmd
from strata.gguf import open_model
from strata.gguf.routing import save_routing_npz
from strata.memory.budget import host_budget_for_slots
from strata.synth import build_checkpoint
from tests.memory.tiered_fixture import N_EXPERTS, N_LAYERS, TOP_K, prompt, tiered

from .split_fixture import split_gguf, tensor_cuts

torch.set_num_threads(1)
#: Slot forms of the tiered memory (float compute: packed compute is the paged memory's), as tests/memory/test_tiered.py
FORMS = ("dequantized", "packed")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{"whole": the unsplit file, "strata": the first of the converter's parts, "gguf-split":
    the first of gguf-split-like parts}, all of one checkpoint with routing statistics."""
    root = tmp_path_factory.mktemp("split-memory")
    hf = build_checkpoint(root / "hf", seed=3, num_hidden_layers=N_LAYERS, num_experts=N_EXPERTS,
                          num_experts_per_tok=TOP_K)
    counts = np.random.default_rng(5).gamma(0.5, size=(N_LAYERS, N_EXPERTS)) * 100
    save_routing_npz(root / "routing.npz", counts, 1000)
    whole = root / "whole.gguf"
    convert(hf, whole, TypePolicy(), name="split-test", n_threads=2, routing_stats=root / "routing.npz")
    with open_model(whole) as mf:
        third = sum(t.nbytes for t in mf.tensors.values()) // 3
    convert(hf, root / "ours.gguf", TypePolicy(), name="split-test", n_threads=2,
            routing_stats=root / "routing.npz", split_max_size=third)
    ours = sorted(root.glob("ours-*-of-*.gguf"))
    theirs = split_gguf(whole, root / "theirs", tensor_cuts(whole, 4))
    return {"whole": whole, "strata": ours[0], "gguf-split": theirs[1]}


KINDS = ["strata", "gguf-split"]


def test_the_parts_hold_experts_in_several_files(files):
    for kind in KINDS:
        with open_model(files[kind]) as mf, open_model(files["whole"]) as whole:
            assert len(mf.parts) >= 3
            where = {mf.part_of(mf.expert(layer, e, p).offset).index
                     for layer in mf.expert_layers for e in range(N_EXPERTS) for p in ("gate", "up", "down")}
            assert len(where) >= 2, kind
            assert mf.routing_counts()[1] == whole.routing_counts()[1] == 1000
            assert np.array_equal(mf.routing_counts()[0], whole.routing_counts()[0])


def _run(path, **kw):
    with strata.load(path, threads=1, n_ctx=128, max_batch=1, **kw) as m:
        ids = prompt(20)
        logits, tokens = m.logits(ids), m.generate(ids, temperature=0, max_tokens=12, stop_token_ids=()).token_ids
        stats = m.memory_stats()  # None for the direct memory
        return logits, tokens, stats.totals() if stats is not None else {}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("compute", ["float", "packed"])
def test_direct_memory_logits_are_identical(files, kind, compute):
    want = _run(files["whole"], memory="direct", compute=compute)
    got = _run(files[kind], memory="direct", compute=compute)
    assert torch.equal(got[0], want[0]) and got[1] == want[1]


@pytest.mark.parametrize("kind", KINDS)
def test_paged_memory_logits_are_identical_under_evictions(files, kind):
    def budget(path):
        with open_model(path) as mf:
            return host_budget_for_slots(mf, TOP_K + 1)

    want = _run(files["whole"], memory="paged", host_mem=budget(files["whole"]))
    got = _run(files[kind], memory="paged", host_mem=budget(files[kind]))
    assert torch.equal(got[0], want[0]) and got[1] == want[1]
    assert got[2]["evictions"] > 0 and got[2]["bytes_disk"] > 0
    assert got[2]["disk_reads"] == want[2]["disk_reads"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("form", FORMS)
def test_tiered_memory_logits_are_identical(files, kind, form):
    def run(path):
        return _run(path, compute="float", memory=tiered(path, form, 1))

    want, got = run(files["whole"]), run(files[kind])
    assert torch.equal(got[0], want[0]) and got[1] == want[1]
    assert got[2]["disk_reads"] + got[2]["prefetch_disk_reads"] > 0 and got[2]["evictions"] > 0


@pytest.mark.parametrize("kind", KINDS)
def test_placement_is_the_unsplit_file_s(files, kind):
    def placement(path):
        args = types.SimpleNamespace(model=str(path), json=True, placement=True, device="cpu", device_mem="4M",
                                     host_mem="4M", ctx=128, compute="packed", kv_type=None)
        out = io.StringIO()
        assert inspect_cmd.run(args, out) == 0
        return json.loads(out.getvalue())

    want, got = placement(files["whole"]), placement(files[kind])
    assert got["placement"] == want["placement"]
    assert got["placement"]["estimate_from"] == want["placement"]["estimate_from"] == "routing statistics"
    assert len(got["parts"]) >= 3 and len(want["parts"]) == 1


def test_the_slow_path_warning_probes_the_largest_part(files, monkeypatch):
    import strata.memory.placement as placement

    probed = []

    def probe(path, limit=None, **kw):
        probed.append(path)
        return 1e9, 1 << 20

    monkeypatch.setattr(placement, "sequential_direct_rate", probe)
    with open_model(files["gguf-split"]) as mf, pytest.warns(Warning, match="from the disk"):
        slow = placement.estimate(mf, 0, 1)
        assert slow.disk_share > placement.SLOW_PATH_SHARE
        assert "1.00 GB/s" in placement.warn_if_slow(mf, slow)
        assert probed == [max(mf.parts, key=lambda p: p.size).path] and probed[0] != mf.path
