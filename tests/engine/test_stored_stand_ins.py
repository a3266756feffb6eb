"""Stored miss stand-ins (converters.stand_ins, strata.gguf.standins): `strata convert
--add-stand-ins TYPE MODEL.gguf` writes MODEL.standins.gguf beside the model (which it leaves
byte for byte as it was); the sidecar's tensors are the bytes the paged memory builds at load
(gguf-py reads them as Q2_K tensors of the experts' shapes); a load with --miss-stand-in of that
type copies them without quantizing anything and decodes as with the built ones; another type is
built at load; a stale or foreign sidecar is a one-line error naming it."""
from __future__ import annotations

import hashlib
import shutil

import gguf
import numpy as np
import pytest
import torch

import strata
from strata import native
from strata.commands.convert import main as convert_main
from strata.errors import StrataError
from strata.gguf import PARTS, open_model
from strata.gguf.standins import stand_ins_path
from strata.memory.budget import host_budget_for_slots
from strata.memory.standin import StandIns, requantized
from strata.quant import GGMLType
from tests.fixtures.tiny import zoo

T = GGMLType


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A copy of the tiny Mixtral file in a folder of its own (the sidecar goes beside it)."""
    src = zoo().get("mixtral").gguf(None)
    dst = tmp_path_factory.mktemp("stored") / "mixtral.gguf"
    shutil.copyfile(src, dst)
    return dst


@pytest.fixture(scope="module")
def built(model):
    """The Q2_K stand-ins built at load (no sidecar yet): (layer, part) -> uint8 [E, bytes]."""
    assert not stand_ins_path(model).exists()
    with open_model(model) as mf:
        s = StandIns(mf, "q2_k", mf.expert_layers)
        assert s.stored is None
        return {(layer, part): _bytes(s.parts(layer)[p])
                for layer in mf.expert_layers for p, part in enumerate(PARTS)}


@pytest.fixture(scope="module")
def sidecar(model, built):
    before = hashlib.sha256(model.read_bytes()).hexdigest()
    assert convert_main(["--add-stand-ins", "q2_k", str(model), "--threads", "1"]) == 0
    assert hashlib.sha256(model.read_bytes()).hexdigest() == before  # the model file is not touched
    return stand_ins_path(model)


def _bytes(part) -> np.ndarray:
    """Every expert's matrix of a native.MoePart, in expert order: uint8 [E * matrix bytes]."""
    return np.concatenate([np.asarray(part.matrix(e)).reshape(-1) for e in range(part.n_experts)])


def _load(path, **kw):
    with open_model(path) as mf:
        budget = host_budget_for_slots(mf, 2)
    return strata.load(path, threads=1, n_ctx=128, max_batch=1, memory="paged", host_mem=budget + (1 << 22), **kw)


def test_the_sidecar_holds_the_stand_ins_built_at_load(model, built, sidecar):
    assert sidecar.name == "mixtral.standins.gguf"
    reader = gguf.GGUFReader(sidecar)
    tensors = {t.name: t for t in reader.tensors}
    with open_model(model) as mf:
        assert len(tensors) == 3 * len(mf.expert_layers)
        for (layer, part), want in built.items():
            t = tensors[f"blk.{layer}.ffn_{part}_exps.weight"]
            rows, cols = mf.expert(layer, 0, part).shape
            assert t.tensor_type == T.Q2_K and tuple(int(n) for n in reversed(t.shape)) == (mf.hparams.n_experts, rows, cols)
            assert np.array_equal(np.asarray(t.data).reshape(-1), want.reshape(-1))


def test_a_load_copies_the_stored_bytes_and_quantizes_nothing(model, built, sidecar, monkeypatch):
    calls = []
    quantize_into = native.quantize_into
    monkeypatch.setattr(native, "quantize_into", lambda *a, **k: calls.append(a[0]) or quantize_into(*a, **k))
    reader = gguf.GGUFReader(sidecar)
    stored = {t.name: np.asarray(t.data).reshape(-1) for t in reader.tensors}
    with open_model(model) as mf:
        s = StandIns(mf, "q2_k", mf.expert_layers)
        assert s.stored == sidecar and calls == []
        for layer in mf.expert_layers:
            for p, part in enumerate(PARTS):
                got = s.parts(layer)[p]
                assert np.array_equal(_bytes(got), stored[f"blk.{layer}.ffn_{part}_exps.weight"])
                assert not np.shares_memory(np.asarray(got.matrix(0)), reader.data)  # a resident copy
        other = StandIns(mf, "q6_k", mf.expert_layers[:1])  # another type (the file's is Q4_K): built at load
        assert other.stored is None and calls and set(calls) == {T.Q6_K}


def test_decoding_with_stored_stand_ins_equals_decoding_with_built_ones(model, built, sidecar, tmp_path):
    bare = tmp_path / "bare.gguf"  # the same model without a sidecar
    shutil.copyfile(model, bare)
    ids = zoo().get("mixtral").prompt_ids(10, seed=41)
    with _load(model, miss_stand_in="q2_k") as a, _load(bare, miss_stand_in="q2_k") as b:
        assert a.memory.stand_ins.stored == sidecar and b.memory.stand_ins.stored is None
        out_a = a.generate(ids, temperature=0, max_tokens=6, stop_token_ids=())
        out_b = b.generate(ids, temperature=0, max_tokens=6, stop_token_ids=())
        assert a.memory_stats().totals()["stand_ins"] > 0
        assert out_a.token_ids == out_b.token_ids
        assert torch.equal(a.logits(ids), b.logits(ids))


def test_a_stale_or_foreign_sidecar_is_one_line_naming_it(model, sidecar, tmp_path):
    grown = tmp_path / "grown.gguf"
    grown.write_bytes(model.read_bytes() + bytes(64))  # a different file of the same model
    shutil.copyfile(sidecar, stand_ins_path(grown))
    with pytest.raises(StrataError) as e:
        _load(grown, miss_stand_in="q2_k")
    assert "grown.standins.gguf" in str(e.value) and "--add-stand-ins q2_k" in str(e.value)
    assert "\n" not in str(e.value)
    foreign = tmp_path / "foreign.gguf"
    shutil.copyfile(model, foreign)
    shutil.copyfile(model, stand_ins_path(foreign))  # a model where the stand-ins should be
    with pytest.raises(StrataError, match="foreign.standins.gguf: not a stand-ins file"):
        _load(foreign, miss_stand_in="q2_k")


def test_convert_refuses_bad_stand_in_arguments(model, capsys):
    assert convert_main(["--add-stand-ins", "iq2_xs", str(model)]) == 1
    assert "'iq2_xs'" in capsys.readouterr().err
    assert convert_main(["--add-stand-ins", "q2_k", str(model), "-o", "x.gguf"]) == 1
    assert "drop -o" in capsys.readouterr().err
    assert convert_main([str(model)]) == 1
    assert "-o/--output" in capsys.readouterr().err


def test_convert_with_stand_ins_writes_the_sidecar_of_its_output(tmp_path):
    out = tmp_path / "out.gguf"
    hf_dir = zoo().get("mixtral").hf_dir
    assert convert_main([str(hf_dir), "-o", str(out), "--stand-ins", "q2_k", "--threads", "1", "--no-progress"]) == 0
    with open_model(out) as mf:
        s = StandIns(mf, "q2_k", mf.expert_layers)
        assert s.stored == tmp_path / "out.standins.gguf"
        layer = mf.expert_layers[0]
        for p, part in enumerate(PARTS):  # the converter's sidecar holds the bytes a load would build
            want = np.concatenate([b.copy() for b in requantized(mf, T.Q2_K, layer, part)])
            assert np.array_equal(_bytes(s.parts(layer)[p]), want)
