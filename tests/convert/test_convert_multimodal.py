"""Converting the released multimodal classes (Qwen3_5MoeForConditionalGeneration,
Llama4ForConditionalGeneration) as their text model: the GGUF file equals the one converted from
the CausalLM class with the same text weights, and runs as transformers' multimodal model does on
text; the vision tower is skipped and said so once; a text part with a tensor missing is refused
in one line."""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from safetensors.torch import load_file, save_file

from converters import ConversionError, TypePolicy, convert
from tests.convert.fixtures import MULTIMODAL, build_multimodal, save_checkpoint
from tests.convert.released import quantized_pair
from tests.convert.test_fp8_source import BLOCK, _fp8_projection
from tests.fixtures.tiny import llama_cpp_source, zoo
from tests.models.helpers import REL_TOL, Bare, rel_err

KEYS = sorted(MULTIMODAL)
#: Saving Llama 4's tower in bfloat16 casts its complex rotary buffer (not in the checkpoint) to real.
pytestmark = pytest.mark.filterwarnings("ignore:Casting complex values to real")
F32 = TypePolicy.from_args(outtype="f32")


@pytest.fixture(scope="module")
def multimodal(tmp_path_factory):
    """key -> (transformers' multimodal model, its checkpoint folder), built once per module."""
    built = {}
    for key in KEYS:
        tiny = zoo().get(key)
        model = build_multimodal(key, tiny.model)
        folder = save_checkpoint(copy.deepcopy(model), tiny.spec, tiny.tokenizer,
                                 tmp_path_factory.mktemp(key) / "hf", fused=False)
        built[key] = (model, folder)
    return built


def _fields(r: GGUFReader) -> dict:
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.") and k != "general.name"}


def _tensors(r: GGUFReader) -> list:
    return [(t.name, t.tensor_type, [int(d) for d in t.shape], bytes(np.asarray(t.data).tobytes())) for t in r.tensors]


@pytest.mark.parametrize("key", KEYS)
def test_same_file_as_the_causal_lm(key, multimodal, tmp_path):
    tiny, (_, folder) = zoo().get(key), multimodal[key]
    convert(folder, tmp_path / "mm.gguf", F32, name=f"tiny-{key}", n_threads=2)
    got, want = GGUFReader(tmp_path / "mm.gguf"), GGUFReader(tiny.gguf("f32"))
    assert _fields(got) == _fields(want)
    assert _tensors(got) == _tensors(want)


@pytest.mark.parametrize("key", KEYS)
def test_logits_equal_transformers_multimodal_model_on_text(key, multimodal, tmp_path):
    model, folder = multimodal[key]
    convert(folder, tmp_path / "mm.gguf", F32, n_threads=2)
    ids = zoo().get(key).prompt_ids(20)
    # transformers 5.24's Llama4ForConditionalGeneration.forward fails after its text model has run
    # (it reads `image_outputs` from the text model's output): call that text model as it does.
    text = model.language_model if key == "llama4" else model
    with torch.no_grad():
        want = text(input_ids=torch.tensor([ids])).logits[0].float()
    assert rel_err(Bare(tmp_path / "mm.gguf").forward(ids, 0), want) <= REL_TOL


@pytest.mark.parametrize("key", KEYS)
def test_vision_tower_skipped_and_named_once(key, multimodal, tmp_path, caplog):
    _, folder = multimodal[key]
    with caplog.at_level(logging.WARNING, logger="strata.convert"):
        planned = convert(folder, tmp_path / "mm.gguf", F32, n_threads=2)
    said = [r.getMessage() for r in caplog.records if "vision tower" in r.getMessage()]
    towers = {"qwen35moe": ["model.visual.* (21 tensors)"],
              "llama4": ["multi_modal_projector.* (1 tensor)", "vision_model.* (25 tensors)"]}[key]
    assert len(said) == 1 and all(t in said[0] for t in towers) and "mmproj" in said[0], said
    assert not any("visual" in s or "vision" in s or "projector" in s for p in planned for s in p.sources)


@pytest.mark.parametrize("key", KEYS)
def test_text_part_missing_a_tensor(key, multimodal, tmp_path):
    _, folder = multimodal[key]
    hf = Path(shutil.copytree(folder, tmp_path / "hf"))
    (path,) = hf.glob("*.safetensors")
    weights = load_file(path)
    gone = {"qwen35moe": "model.language_model.layers.3.self_attn.q_proj.weight",
            "llama4": "language_model.model.layers.2.self_attn.q_proj.weight"}[key]
    del weights[gone]
    save_file(weights, path, metadata={"format": "pt"})
    with pytest.raises(ConversionError) as err:
        convert(hf, tmp_path / "out.gguf", F32)
    msg = str(err.value)
    assert "\n" not in msg and "missing tensors for blk." in msg and MULTIMODAL[key][1] in msg, msg
    assert not (tmp_path / "out.gguf").exists()


@pytest.mark.parametrize("key", KEYS)
def test_fp8_multimodal_checkpoint(key, multimodal, tmp_path):
    """Block-scaled fp8 `*_proj` weights (the text model's, and Llama 4's tower's): the scales follow
    their weights to the text model's names or out with the tower; the file equals the float one's."""
    config = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [BLOCK, BLOCK]}
    fp8_dir, ref_dir, quant = quantized_pair(multimodal[key][1], tmp_path, _fp8_projection, config)
    assert key != "llama4" or any(n.startswith("vision_model.") and n.endswith("scale_inv") for n in quant)
    assert any("language_model." in n and n.endswith("scale_inv") for n in quant)
    convert(fp8_dir, tmp_path / "fp8.gguf", F32, n_threads=2)
    convert(ref_dir, tmp_path / "ref.gguf", F32, n_threads=2)
    assert _tensors(GGUFReader(tmp_path / "fp8.gguf")) == _tensors(GGUFReader(tmp_path / "ref.gguf"))


def test_multimodal_config_without_text_config(multimodal, tmp_path):
    _, folder = multimodal["qwen35moe"]
    hf = Path(shutil.copytree(folder, tmp_path / "hf"))
    cfg = json.loads((hf / "config.json").read_text())
    del cfg["text_config"]
    (hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match=r"config.json: Qwen3_5MoeForConditionalGeneration needs a text_config"):
        convert(hf, tmp_path / "out.gguf", F32)


@pytest.mark.skipif(llama_cpp_source() is None, reason="llama.cpp's source tree not found: set STRATA_LLAMA_CPP_SRC")
@pytest.mark.parametrize("key", KEYS)
def test_same_tensors_as_llama_cpps_converter(key, multimodal, tmp_path):
    """llama.cpp's converter, given the multimodal checkpoint, writes the same text tensors (names,
    types, shapes; values to float32 rounding: its -exp(A_log) is torch's, Strata's numpy's)."""
    _, folder = multimodal[key]
    other = dataclasses.replace(zoo().get(key), hf_dir=folder, root=tmp_path, _files={})
    convert(folder, tmp_path / "mm.gguf", F32, n_threads=2)
    ours = {t.name: t for t in GGUFReader(tmp_path / "mm.gguf").tensors}
    theirs = {t.name: t for t in GGUFReader(other.llama_cpp_gguf("f32")).tensors}
    assert sorted(ours) == sorted(theirs)
    for name, t in ours.items():
        assert (t.tensor_type, list(t.shape)) == (theirs[name].tensor_type, list(theirs[name].shape)), name
        np.testing.assert_allclose(np.asarray(t.data), np.asarray(theirs[name].data), rtol=1e-6, atol=0, err_msg=name)


def test_a_tensor_twice_under_the_text_models_name(multimodal, tmp_path):
    _, folder = multimodal["llama4"]
    hf = Path(shutil.copytree(folder, tmp_path / "hf"))
    (path,) = hf.glob("*.safetensors")
    weights = load_file(path)
    weights["lm_head.weight"] = weights["language_model.lm_head.weight"].clone()
    save_file(weights, path, metadata={"format": "pt"})
    with pytest.raises(ConversionError, match=r"tensor language_model.lm_head.weight is the language model's "
                                              r"lm_head.weight, as is lm_head.weight|tensor lm_head.weight is the "
                                              r"language model's lm_head.weight, as is language_model.lm_head.weight"):
        convert(hf, tmp_path / "out.gguf", F32)
