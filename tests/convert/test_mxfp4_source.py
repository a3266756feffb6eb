"""gpt-oss checkpoints in their released MXFP4 form (experts as `*_blocks` uint8 + `*_scales` E8M0,
[out, in] orientation): the experts stay MXFP4 in the GGUF, nibbles repacked into ggml's blocks.
Fixture: the tiny gpt-oss's experts quantized with gguf-py's MXFP4 and re-saved in the released
layout (value 2j in the low nibble of byte j, one scale byte per 32 values)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT
from gguf import GGUFReader

import strata
from converters import TypePolicy, convert
from tests.convert.released import quantized_pair
from tests.fixtures.tiny import zoo
from tests.models.helpers import REL_TOL, rel_err


def _to_released(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float [..., R, C] -> (HF blocks [..., R, C/32, 16], scales [..., R, C/32], the values MXFP4 holds)."""
    *lead, R, C = rows.shape
    q = gguf.quants.quantize(rows.reshape(-1, C).astype(np.float32), GT.MXFP4).reshape(-1, 17)  # ggml blocks
    scales, qs = q[:, 0], q[:, 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # ggml: value j low, value j + 16 high
    blocks = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)  # released: 2j low, 2j + 1 high
    values = gguf.quants.dequantize(q.reshape(-1, C // 32 * 17), GT.MXFP4).reshape(rows.shape)
    return (np.ascontiguousarray(blocks.reshape(*lead, R, C // 32, 16)),
            np.ascontiguousarray(scales.reshape(*lead, R, C // 32)), values)


def _mxfp4_experts(name: str, w: torch.Tensor):
    if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
        return None
    blocks, scales, values = _to_released(w.float().transpose(1, 2).numpy())  # [E, out, in]
    return ({name + "_blocks": torch.from_numpy(blocks), name + "_scales": torch.from_numpy(scales)},
            torch.from_numpy(values).transpose(1, 2).contiguous())


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """(MXFP4 checkpoint, float32 checkpoint of the same values)."""
    config = {"quant_method": "mxfp4",
              "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router"]}
    q_dir, ref_dir, _ = quantized_pair(zoo().get("gptoss").hf_dir, tmp_path_factory.mktemp("mxfp4"),
                                       _mxfp4_experts, config)
    return q_dir, ref_dir


def test_released_mxfp4_experts_are_kept_bit_exact(released, tmp_path):
    """Each expert tensor's bytes equal gguf-py's MXFP4 of the same values; the rest of the file
    equals converting the float checkpoint of those values."""
    q_dir, ref_dir = released
    convert(q_dir, tmp_path / "q.gguf", TypePolicy.from_args(outtype="f32"), n_threads=2)
    convert(ref_dir, tmp_path / "ref.gguf", TypePolicy.from_args(outtype="f32"), n_threads=2)
    got = {t.name: t for t in GGUFReader(tmp_path / "q.gguf").tensors}
    ref = {t.name: t for t in GGUFReader(tmp_path / "ref.gguf").tensors}
    assert got.keys() == ref.keys()
    n = 0
    for name, t in got.items():
        if name.endswith("_exps.weight"):
            assert t.tensor_type == GT.MXFP4 and ref[name].tensor_type == GT.F32
            values = np.array(ref[name].data).reshape(-1, int(t.shape[0]))
            assert np.array_equal(np.array(t.data).reshape(-1), gguf.quants.quantize(values, GT.MXFP4).reshape(-1))
            n += 1
        else:
            assert t.tensor_type == ref[name].tensor_type and np.array_equal(np.array(t.data), np.array(ref[name].data))
    assert n == 3 * 4


def test_released_mxfp4_checkpoint_logits_match_transformers(released, tmp_path):
    import transformers
    q_dir, ref_dir = released
    convert(q_dir, tmp_path / "q.gguf", TypePolicy.from_args(outtype="f32"), n_threads=2)
    model = transformers.AutoModelForCausalLM.from_pretrained(ref_dir, torch_dtype=torch.float32).eval()
    tiny = zoo().get("gptoss")
    ids = tiny.prompt_ids(36)
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0]
    assert rel_err(want, tiny.hf_logits(ids)) > 1e-3  # the reference is the MXFP4 model, not the bf16 one
    with strata.load(tmp_path / "q.gguf", threads=1, n_ctx=64, max_batch=1, compute="float") as ours:
        assert rel_err(ours.logits(ids), want) <= REL_TOL


@pytest.mark.interop
def test_released_mxfp4_file_in_llama_cpp(released, tmp_path):
    """llama.cpp reads the repacked experts as its own MXFP4 (measured 7.9e-4 of the range, top-1 1.0:
    its MXFP4 products round activations to 8 bits)."""
    pytest.importorskip("llama_cpp")
    import transformers

    from tests.engine.test_llama_cpp import LlamaCpp
    q_dir, ref_dir = released
    convert(q_dir, tmp_path / "q.gguf", TypePolicy.from_args(outtype="f32"), n_threads=2)
    model = transformers.AutoModelForCausalLM.from_pretrained(ref_dir, torch_dtype=torch.float32).eval()
    ids = zoo().get("gptoss").prompt_ids(36)
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0]
    llama = LlamaCpp(tmp_path / "q.gguf")
    got = llama.logits(ids)
    llama.close()
    assert rel_err(got, want) <= 5e-3 and float((got.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.95
