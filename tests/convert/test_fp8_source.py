"""Block-scaled fp8 checkpoints (DeepSeek-V3's release form): F8_E4M3 weights with float32
`weight_scale_inv` [ceil(N/128), ceil(K/128)] are dequantized on read. Fixture: the tiny V3's
projection and expert weights re-saved as fp8 + block scales (rows of 96 and 64: partial blocks)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from safetensors.torch import load_file, save_file

import strata
from converters import ConversionError, TypePolicy, convert
from converters.source import Checkpoint
from tests.convert.released import quantized_pair
from tests.fixtures.tiny import zoo
from tests.models.helpers import REL_TOL, rel_err

BLOCK = 128


def _fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (fp8 [N, K], float32 scales [ceil(N/128), ceil(K/128)]) as DeepSeek's release stores them."""
    N, K = w.shape
    pad = torch.zeros(-(-N // BLOCK) * BLOCK, -(-K // BLOCK) * BLOCK)
    pad[:N, :K] = w
    blocks = pad.view(pad.shape[0] // BLOCK, BLOCK, pad.shape[1] // BLOCK, BLOCK)
    scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)  # e4m3's largest finite value
    q = (blocks / scale[:, None, :, None]).view_as(pad)[:N, :K].to(torch.float8_e4m3fn)
    return q, scale.float()


def _dequant(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[: q.shape[0], : q.shape[1]]
    return q.float() * full


def _fp8_projection(name: str, w: torch.Tensor):
    if not (name.endswith(("_proj.weight", "_proj_with_mqa.weight")) and w.ndim == 2):
        return None
    q, s = _fp8(w.float())
    return {name: q, name.replace(".weight", ".weight_scale_inv"): s}, _dequant(q, s)


@pytest.fixture(scope="module")
def fp8_pair(tmp_path_factory):
    """(fp8 checkpoint, float32 checkpoint of the same dequantized values, number of fp8 weights)."""
    config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [BLOCK, BLOCK]}
    fp8_dir, ref_dir, quant = quantized_pair(zoo().get("deepseek3").hf_dir, tmp_path_factory.mktemp("fp8"),
                                             _fp8_projection, config)
    return fp8_dir, ref_dir, sum(1 for n in quant if n.endswith("weight_scale_inv"))


def test_e4m3_decoding_is_exact():
    from converters.source import _E4M3
    every = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    assert np.array_equal(_E4M3, every, equal_nan=True)


def test_fp8_reads_are_the_dequantized_values(fp8_pair):
    fp8_dir, ref_dir, n = fp8_pair
    with Checkpoint(fp8_dir) as fp8, Checkpoint(ref_dir) as ref:
        assert n > 20 and len(fp8.scales) == n and set(fp8.tensors) == set(ref.tensors)
        name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"  # [96, 256]: one partial row block
        assert fp8.tensors[name].dtype == "F8_E4M3"
        assert np.array_equal(fp8.read_rows(name), ref.read_rows(name))
        assert np.array_equal(fp8.read_rows(name, 50, 30), ref.read_rows(name, 50, 30))
        assert np.array_equal(fp8.read_slab(name, 1, (32, 256)), ref.read_rows(name, 32, 32))


def test_fp8_checkpoint_converts_to_the_dequantized_model(fp8_pair, tmp_path):
    """The converted file equals converting the dequantized float checkpoint, tensor for tensor, and
    its logits match transformers running the dequantized weights."""
    import transformers
    fp8_dir, ref_dir, _ = fp8_pair
    policy = TypePolicy.from_args(outtype="f32")
    convert(fp8_dir, tmp_path / "fp8.gguf", policy, n_threads=2)
    convert(ref_dir, tmp_path / "ref.gguf", policy, n_threads=2)
    a = {t.name: np.array(t.data) for t in GGUFReader(tmp_path / "fp8.gguf").tensors}
    b = {t.name: np.array(t.data) for t in GGUFReader(tmp_path / "ref.gguf").tensors}
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    model = transformers.AutoModelForCausalLM.from_pretrained(ref_dir, torch_dtype=torch.float32).eval()
    tiny = zoo().get("deepseek3")
    ids = tiny.prompt_ids(36)
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    assert rel_err(ref, tiny.hf_logits(ids)) > 1e-3  # fp8 rounding shows: the reference is the fp8 model
    with strata.load(tmp_path / "fp8.gguf", threads=1, n_ctx=64, max_batch=1) as ours:
        assert rel_err(ours.logits(ids), ref) <= REL_TOL


def test_fp8_without_scales_is_refused(fp8_pair, tmp_path):
    fp8_dir, _, _ = fp8_pair
    src = tmp_path / "hf"
    shutil.copytree(fp8_dir, src)
    (path,) = sorted(src.glob("*.safetensors"))
    state = load_file(path)
    del state["model.layers.0.self_attn.o_proj.weight_scale_inv"]
    save_file(state, path, metadata={"format": "pt"})
    with pytest.raises(ConversionError, match="o_proj.weight has no weight_scale_inv"):
        Checkpoint(src)
