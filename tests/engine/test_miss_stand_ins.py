"""Low-bit stand-ins for missed experts (strata.memory.standin, the paged memory's miss_stand_in):
off by default and without effect when off; with every expert in RAM they are never used; a
forced miss computes the stand-in's bytes (held to torch over gguf-py's dequantization); their
bytes come out of the budget; background mode reads the missed expert for its next use, instead
mode does not; a bad type is one line naming it."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.quants import dequantize

import strata
from strata import native
from strata.errors import StrataError
from strata.gguf import PARTS, open_model
from strata.memory.budget import host_budget_for_slots
from strata.memory.policy import READY
from strata.quant import GGMLType, row_bytes
from strata.units import format_bytes
from tests.fixtures.tiny import zoo

T = GGMLType


@pytest.fixture(scope="module")
def tiny():
    return zoo().get("mixtral")


def _budget(path, slots: int) -> int:
    with open_model(path) as mf:
        return host_budget_for_slots(mf, slots)


def _stand_in_bytes(path, t=T.Q2_K) -> int:
    """Every routed expert's three matrices in `t`, computed from the file's shapes."""
    with open_model(path) as mf:
        n = 0
        for layer in mf.expert_layers:
            for part in PARTS:
                rows, cols = mf.expert(layer, 0, part).shape
                n += mf.hparams.n_experts * rows * row_bytes(t, cols)
        return n


def _load(path, **kw):
    return strata.load(path, threads=1, n_ctx=128, max_batch=1, memory="paged", **kw)


def test_off_by_default_and_logits_unchanged_when_off(tiny):
    path = tiny.gguf(None)
    ids = tiny.prompt_ids(12, seed=31)
    with strata.load(path, threads=1, n_ctx=128, max_batch=1, memory="direct") as direct, \
            _load(path, host_mem=_budget(path, 2)) as paged:
        assert paged.memory.stand_ins is None and paged.memory_stats().totals()["stand_in_bytes"] == 0
        assert torch.equal(paged.logits(ids), direct.logits(ids))
        want = direct.generate(ids, temperature=0, max_tokens=6, stop_token_ids=())
        got = paged.generate(ids, temperature=0, max_tokens=6, stop_token_ids=())
        assert got.token_ids == want.token_ids and paged.memory_stats().totals()["stand_ins"] == 0


def test_every_expert_resident_means_no_stand_in_and_the_same_bytes(tiny):
    path = tiny.gguf(None)
    ids = tiny.prompt_ids(12, seed=32)
    every = _budget(path, 4) + _stand_in_bytes(path)
    with _load(path, host_mem=_budget(path, 4)) as off, _load(path, host_mem=every, miss_stand_in="q2_k") as on:
        assert on.memory.host.slots_per_layer == on.memory.n_experts
        for m in (on, off):  # first uses are misses (stand-ins): then every expert is in RAM
            m.generate(tiny.prompt_ids(30, seed=1), temperature=0, max_tokens=2, stop_token_ids=())
            m.memory.check_fixed()
            m.memory_stats().reset()
        assert (on.memory.page_table >= 0).all()
        assert torch.equal(on.logits(ids), off.logits(ids))
        a = on.generate(ids, temperature=0, max_tokens=6, stop_token_ids=())
        b = off.generate(ids, temperature=0, max_tokens=6, stop_token_ids=())
        assert a.token_ids == b.token_ids
        assert on.memory_stats().totals()["stand_ins"] == 0


def test_budget_counts_the_stand_ins(tiny):
    path = tiny.gguf(None)
    budget = _budget(path, 3) + _stand_in_bytes(path)
    with _load(path, host_mem=budget, miss_stand_in="Q2_K") as m:
        mem = m.memory
        assert mem.stand_ins.nbytes == _stand_in_bytes(path)
        assert mem.host.budget == budget - _stand_in_bytes(path)
        assert mem.host.slots_per_layer == 3
        t = m.memory_stats().totals()
        assert t["stand_in_bytes"] == _stand_in_bytes(path) and t["stand_in_type"] == "Q2_K"
        from strata.commands.tiers import format_memory_stats
        assert f"miss stand-ins: Q2_K copies of every expert in RAM, {format_bytes(_stand_in_bytes(path))}" \
            in format_memory_stats(m.memory_stats(), m.device)
    with pytest.raises(StrataError, match="too small"):  # the stand-ins leave too little for top-k slots
        _load(path, host_mem=_budget(path, 2) + _stand_in_bytes(path) - 4096, miss_stand_in="q2_k")


def test_a_budget_too_small_for_the_stand_ins_is_refused_before_building_them(tiny, monkeypatch):
    """The check comes from the file's shapes: nothing quantized or copied (a budget under a
    memory limit would otherwise be killed by the copies before the refusal)."""
    import strata.memory.paged as paged

    path = tiny.gguf(None)
    built = []
    monkeypatch.setattr(paged, "StandIns", lambda *a, **k: built.append(a) or pytest.fail("stand-ins built"))
    need = _budget(path, 2) + _stand_in_bytes(path)
    for budget in (_stand_in_bytes(path) // 2, need - 4096):
        with pytest.raises(StrataError) as e:
            _load(path, host_mem=budget, miss_stand_in="q2_k")
        msg = str(e.value)
        assert "too small" in msg and "Q2_K miss stand-ins" in msg and "--miss-stand-in" in msg
        assert format_bytes(need) in msg and format_bytes(_stand_in_bytes(path)) in msg
    assert not built


def test_stand_in_bytes_are_the_file_experts_requantized(tiny):
    path = tiny.gguf(None)
    with _load(path, host_mem=_budget(path, 2) + _stand_in_bytes(path), miss_stand_in="q2_k") as m:
        mf, layer = m.memory.model_file, m.memory.layers.layer(0)
        parts = m.memory.stand_ins.parts(layer)
        for p, part in enumerate(PARTS):
            slab = mf.expert(layer, 3, part)
            data, stride = mf.expert_region(layer, part)
            values = dequantize(np.asarray(data[3 * stride:3 * stride + slab.nbytes]), slab.ggml_type)
            want = native.quantize(T.Q2_K, values.reshape(slab.shape).astype(np.float32))
            assert np.array_equal(np.asarray(parts[p].matrix(3)).reshape(-1), want.reshape(-1))


def _swiglu(x, gate, up, down):
    return torch.nn.functional.silu(x @ gate.T) * (x @ up.T) @ down.T


def _expert(matrix_of, e, shapes, t):
    return [torch.from_numpy(dequantize(np.asarray(matrix_of(p, e)).reshape(-1), t).reshape(shapes[p]).copy())
            for p in range(3)]


def test_a_forced_miss_computes_the_stand_in(tiny):
    """Two experts not in RAM ("instead", slots full: never read): the routed experts' output is the Q2_K
    stand-ins' SwiGLU (gguf-py's dequantization, torch), up to the kernels' 8-bit activations, and
    not the full experts' (farther from it than the rounding)."""
    path = tiny.gguf(None)
    with _load(path, host_mem=_budget(path, 2) + _stand_in_bytes(path), miss_stand_in="q2_k",
               stand_in_mode="instead") as m:
        mem, block = m.memory, next(b for b in m.transformer.blocks if hasattr(b.ffn, "experts"))
        experts = block.ffn.experts
        li = mem.layers.index(experts.layer)
        mem.acquire(experts.layer, [0, 1])  # fills the layer's two slots (acquire waits)
        mem.release(experts.layer, [0, 1])
        mem.memory_stats().reset()
        missing = [e for e in range(mem.n_experts) if mem.page_table[li, e] < 0]
        assert len(missing) == 2
        x = torch.randn(5, m.hparams.n_embd, generator=torch.Generator().manual_seed(3))
        ids = torch.tensor([missing] * 5)
        w = torch.tensor([[0.7, 0.3]] * 5)
        got = experts(x, w, ids)
        mf = mem.model_file
        shapes = [mf.expert(experts.layer, 0, p).shape for p in PARTS]
        sp = mem.stand_ins.parts(experts.layer)
        low = [_expert(lambda p, e: sp[p].matrix(e), e, shapes, T.Q2_K) for e in missing]

        def full_matrix(p, e):
            data, stride = mf.expert_region(experts.layer, PARTS[p])
            return data[e * stride:e * stride + mf.expert(experts.layer, e, PARTS[p]).nbytes]

        full = [_expert(full_matrix, e, shapes, mf.expert(experts.layer, 0, "gate").ggml_type) for e in missing]
        want = 0.7 * _swiglu(x, *low[0]) + 0.3 * _swiglu(x, *low[1])
        other = 0.7 * _swiglu(x, *full[0]) + 0.3 * _swiglu(x, *full[1])
        err = (got - want).norm() / want.norm()
        assert err < 3e-2 and (got - other).norm() / other.norm() > 10 * err  # measured: 0.019 and 0.46
        t = m.memory_stats().totals()
        assert t["stand_ins"] == 2 and t["disk_reads"] == 0 and (mem.page_table[li, missing] < 0).all()


def test_background_mode_reads_the_missed_expert_for_its_next_use(tiny):
    path = tiny.gguf(None)
    with _load(path, host_mem=_budget(path, 2) + _stand_in_bytes(path), miss_stand_in="q2_k") as m:
        mem, layer = m.memory, m.memory.layers.layer(0)
        li = mem.layers.index(layer)
        e = next(e for e in range(mem.n_experts) if mem.page_table[li, e] < 0)
        held = mem.start(layer, [e])
        assert held.index == [-1] and held.stand_in_index == [e]
        mem.release(layer, [e])
        assert mem._background == {layer} and mem.host.policy.slot_state[mem.page_table[li, e]] != READY
        mem.check_fixed()  # before a program step: the read is done, the page table exact
        slot = mem.page_table[li, e]
        assert slot >= 0 and mem.host.policy.slot_state[slot] == READY and not mem._background
        held = mem.start(layer, [e])
        assert held.index == [slot] and held.stand_in is None
        mem.release(layer, [e])
        t = m.memory_stats().totals()
        assert (t["stand_ins"], t["device_hits"], t["disk_reads"]) == (1, 1, 1)


def test_background_mode_never_evicts_a_hotter_expert_for_a_miss(tiny):
    """A full layer: a miss of an expert used less often than every resident one is served by its
    stand-in and not read; once it is used more often than one of them, its read evicts that one."""
    path = tiny.gguf(None)
    with _load(path, host_mem=_budget(path, 2) + _stand_in_bytes(path), miss_stand_in="q2_k") as m:
        mem, layer = m.memory, m.memory.layers.layer(0)
        li, policy = mem.layers.index(layer), m.memory.host.policy
        resident = [int(e) for e in np.flatnonzero(mem.page_table[li] >= 0)]
        for e in range(mem.n_experts):  # fill the layer's two slots
            if len(resident) == 2:
                break
            if e not in resident:
                mem.start(layer, [e])
                mem.release(layer, [e])
                mem.check_fixed()
                resident.append(e)
        cold, hot = (e for e in range(mem.n_experts) if e not in resident)
        for _ in range(40):
            policy.record(li, np.array(resident))
        reads = m.memory_stats().totals()["disk_reads"]
        for e in (cold, cold):
            mem.observe(layer, torch.tensor([[e]]))
            held = mem.start(layer, [e])
            assert held.stand_in_index == [e]
            mem.release(layer, [e])
            mem.check_fixed()
        assert m.memory_stats().totals()["disk_reads"] == reads and sorted(resident) == \
            sorted(int(e) for e in np.flatnonzero(mem.page_table[li] >= 0))
        for _ in range(300):
            policy.record(li, np.array([resident[0], hot]))  # resident[1] cools down, hot heats up
        held = mem.start(layer, [hot])
        assert held.stand_in_index == [hot]
        mem.release(layer, [hot])
        mem.check_fixed()
        assert m.memory_stats().totals()["disk_reads"] == reads + 1
        assert mem.page_table[li, hot] >= 0 and mem.page_table[li, resident[1]] < 0 and mem.page_table[li, resident[0]] >= 0


def test_decoding_with_stand_ins_runs_the_program_and_counts_them(tiny):
    """Under a budget that misses, greedy decoding with stand-ins runs (program and per-block
    paths), counts stand-ins, and leaves nothing held or loading between steps."""
    path = tiny.gguf(None)
    ids = tiny.prompt_ids(10, seed=33)
    with _load(path, host_mem=_budget(path, 2) + _stand_in_bytes(path), miss_stand_in="q2_k") as m:
        out = m.generate(ids, temperature=0, max_tokens=8, stop_token_ids=())
        assert len(out.token_ids) == 8 and m.memory._held is None
        assert m.memory_stats().totals()["stand_ins"] > 0
        m.memory.check_fixed()
        assert not m.memory.host._loading


@pytest.mark.parametrize("bad", ["q9_z", "iq2_xs", "f32"])
def test_a_bad_stand_in_type_is_one_line_naming_it(tiny, bad):
    with pytest.raises(StrataError) as e:
        _load(tiny.gguf(None), miss_stand_in=bad)
    assert bad in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(StrataError, match="stand_in_mode.*'later'"):
        _load(tiny.gguf(None), miss_stand_in="q2_k", stand_in_mode="later")
    with pytest.raises(StrataError, match="miss_stand_in"):
        _load(tiny.gguf(None), stand_in_mode="instead")
    with pytest.raises(StrataError, match="paged memory"):
        strata.load(tiny.gguf(None), threads=1, n_ctx=64, compute="float", miss_stand_in="q2_k")
