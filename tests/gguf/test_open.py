"""Opening well-formed files: hyperparameters, metadata, tensor records, byte views, summary."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from gguf import GGUFReader

from strata.errors import StrataError
from strata.gguf import ExpertSlab, HParams, ModelFile, TensorInfo, open_model

from . import fixtures as fx
from .fixtures import WRITERS

ARCH_OF = {"mixtral": "llama", "qwen3moe-fused": "qwen3moe"}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_hparams_equal_what_was_written(model_files, name):
    path, expected = model_files[name]
    with open_model(path) as mf:
        hp = mf.hparams
        assert isinstance(hp, HParams) and mf.arch == ARCH_OF.get(name, name)
        for field, value in expected.items():
            got = getattr(hp, field)
            if isinstance(value, float):
                assert got == pytest.approx(value, rel=1e-6), field
            else:
                assert got == value, field


def test_rope_scaling_fields(model_files):
    with open_model(model_files["deepseek2"][0]) as mf:
        rs = mf.hparams.rope_scaling
        assert (rs.type, rs.factor, rs.original_context_length) == ("yarn", 40.0, 128)
        assert rs.yarn_log_multiplier == pytest.approx(0.1)
        assert rs.yarn_beta_fast is None  # absent keys stay None
    with open_model(model_files["qwen3moe"][0]) as mf:
        rs = mf.hparams.rope_scaling
        assert (rs.type, rs.factor, rs.original_context_length) == ("none", 1.0, 512)


def test_hparams_are_frozen(model_files):
    with open_model(model_files["olmoe"][0]) as mf:
        with pytest.raises(dataclasses.FrozenInstanceError):
            mf.hparams.n_experts = 3


def test_metadata_is_plain_python(model_files):
    path, _ = model_files["qwen3moe"]
    with open_model(path) as mf:
        md = mf.metadata
        assert md["general.architecture"] == "qwen3moe"
        assert md["qwen3moe.block_count"] == 2 and type(md["qwen3moe.block_count"]) is int
        assert type(md["qwen3moe.attention.layer_norm_rms_epsilon"]) is float
        assert md["tokenizer.ggml.tokens"] == [f"tok{i}" for i in range(64)]
        assert md["tokenizer.ggml.scores"][:3] == [0.0, -1.0, -2.0]
        assert not any(k.startswith("GGUF.") for k in md)
        json.dumps(md)  # only JSON-able python values


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_metadata_and_tensors_agree_with_gguf_py(model_files, name):
    path, _ = model_files[name]
    reader = GGUFReader(path)
    theirs = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    with open_model(path, cross_check=True) as mf:
        assert mf.metadata == theirs and list(mf.metadata) == list(theirs)


def test_version_2_opens_like_version_3(model_files, tmp_path):
    v2 = fx.patch(fx.copy(model_files["olmoe"][0], tmp_path / "v2.gguf"), 4, "I", 2)
    with open_model(v2, cross_check=True) as mf, open_model(model_files["olmoe"][0]) as mf3:
        assert mf.version == 2 and mf.hparams == mf3.hparams and mf.tensors == mf3.tensors


def test_custom_alignment(tmp_path):
    path = tmp_path / "align256.gguf"
    fx.write_qwen3moe(path, alignment=256)
    with open_model(path, cross_check=True) as mf:
        assert mf.alignment == 256 and mf.metadata["general.alignment"] == 256
        assert all(t.offset % 256 == 0 for t in mf.tensors.values())  # data section starts aligned too
        assert mf.expert(1, 3, "up").offset == mf.tensors["blk.1.ffn_up_exps.weight"].offset + 3 * 64 * 144


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_tensor_records_match_gguf_py(model_files, name):
    path, _ = model_files[name]
    reader = GGUFReader(path)
    with open_model(path) as mf:
        assert list(mf.tensors) == [t.name for t in reader.tensors]  # file order
        for rt in reader.tensors:
            info = mf.tensors[rt.name]
            assert isinstance(info, TensorInfo)
            assert info.ggml_type == rt.tensor_type
            assert info.shape == tuple(reversed([int(d) for d in rt.shape]))
            assert (info.offset, info.nbytes) == (rt.data_offset, rt.n_bytes)
            data = mf.tensor_data(rt.name)
            assert data.dtype == np.uint8 and not data.flags.owndata  # a view of the map
            assert data.tobytes() == np.ascontiguousarray(rt.data).view(np.uint8).tobytes()


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_resident_is_everything_but_routed_experts(model_files, name):
    with open_model(model_files[name][0]) as mf:
        experts = set(mf.tensors) - set(mf.resident)
        assert all("_exps.weight" in n for n in experts)
        assert not any(n.endswith("_exps.weight") for n in mf.resident)
        per_layer = 2 if name == "qwen3moe-fused" else 3
        assert len(experts) == per_layer * len(mf.expert_layers)


def test_expert_biases_and_shared_experts_stay_resident(model_files):
    with open_model(model_files["gpt-oss"][0]) as mf:
        assert "blk.0.ffn_gate_exps.bias" in mf.resident
    with open_model(model_files["qwen2moe"][0]) as mf:
        assert {"blk.1.ffn_up_shexp.weight", "blk.1.ffn_gate_inp_shexp.weight"} <= set(mf.resident)


def test_dense_lead_layer_has_no_experts(model_files):
    with open_model(model_files["deepseek2"][0]) as mf:
        assert mf.expert_layers == [1]
        with pytest.raises(ValueError, match="layer 0 has no routed experts"):
            mf.expert(0, 0, "gate")


def test_expert_argument_errors(model_files):
    with open_model(model_files["qwen3moe"][0]) as mf:
        with pytest.raises(ValueError, match="out of range"):
            mf.expert(0, 4, "gate")
        with pytest.raises(ValueError, match="part 'gate_up'"):
            mf.expert(0, 0, "gate_up")
        assert [s.part for s in mf.expert_slabs(1, 3)] == ["gate", "up", "down"]


def test_close_and_context_manager(model_files):
    mf = open_model(model_files["mixtral"][0])
    assert isinstance(mf, ModelFile)
    view = mf.expert_data(mf.expert(0, 1, "down"))
    before = view.tobytes()
    mf.close()
    assert view.tobytes() == before  # views handed out stay valid
    with pytest.raises(StrataError, match="closed"):
        mf.tensor_data("output.weight")
    with open_model(model_files["mixtral"][0]) as mf2:
        assert mf2.tensor_data("output_norm.weight").nbytes == 256 * 4


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_summary_is_json_and_adds_up(model_files, name):
    with open_model(model_files[name][0]) as mf:
        s = json.loads(json.dumps(mf.summary()))
        total = sum(t.nbytes for t in mf.tensors.values())
        assert s["arch"] == mf.arch and s["n_tensors"] == len(mf.tensors)
        assert s["resident_bytes"] + s["expert_bytes"] == s["tensor_bytes"] == total
        assert sum(v["bytes"] for v in s["types"].values()) == total
        assert sum(v["layer_bytes"] for v in s["expert_layers"].values()) == s["expert_bytes"]
        assert s["hparams"]["n_experts"] == mf.hparams.n_experts
        layer = str(mf.expert_layers[0])
        slab: ExpertSlab = mf.expert(mf.expert_layers[0], 0, "down")
        assert s["expert_layers"][layer]["slab_bytes"]["down"] == slab.nbytes


def test_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        open_model(tmp_path / "absent.gguf")
