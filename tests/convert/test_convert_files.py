"""Converted files read back with gguf-py: names, shapes, types, metadata and values."""
from __future__ import annotations


import gguf
import gguf.quants
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import Keys

from converters import TypePolicy, convert
from fixtures import CHAT_TEMPLATE
from readback import ARCH, field, read_tensors, source_tensors

# Relative RMS error of each type on the fixtures' (Gaussian) weights, with a little room.
REL_RMS = {T.Q8_0: 0.008, T.Q4_K: 0.08, T.Q6_K: 0.022, T.F16: 5e-4, T.BF16: 4e-3}
PRE = {"llama3": "llama-bpe", "qwen2": "qwen2", "gpt2": "gpt-2"}


def _check_values(name: str, t: T, got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, f"{name}: shape {got.shape}, source {want.shape}"
    if t == T.F32:
        assert np.array_equal(got, want), f"{name}: F32 differs from source"
        return
    rel = np.sqrt(np.mean((got - want) ** 2)) / max(np.sqrt(np.mean(want ** 2)), 1e-30)
    assert rel <= REL_RMS[t], f"{name}: {t.name} relative RMS error {rel:.4f} > {REL_RMS[t]}"


@pytest.mark.parametrize("outtype", [None, "f32", "q8_0"], ids=["default", "f32", "q8_0"])
def test_every_tensor_matches_source(tiny, outtype):
    got = read_tensors(tiny.gguf(outtype))
    want = source_tensors(tiny)
    assert sorted(got) == sorted(want)
    for name, (t, values) in got.items():
        _check_values(name, t, values, want[name])


def test_default_types(tiny):
    types = {name: t for name, (t, _) in read_tensors(tiny.gguf()).items()}
    for name, t in types.items():
        if name.endswith(("_norm.weight", ".bias")) or "ffn_gate_inp" in name:
            assert t == T.F32, name
        elif "_exps." in name:
            assert t == T.Q4_K, name
        else:
            assert t == T.Q8_0, name


def test_bf16_source_to_bf16_is_exact(tiny_models):
    tiny = tiny_models["qwen3moe"]  # saved as bfloat16
    out = tiny.root / "bf16.gguf"
    convert(tiny.fused, out, TypePolicy.from_args(outtype="bf16"), name="tiny")
    want = source_tensors(tiny)
    for name, (t, values) in read_tensors(out).items():
        assert t == (T.F32 if values.ndim == 1 or "ffn_gate_inp" in name else T.BF16), name
        assert np.array_equal(values, want[name]), name


def test_metadata(tiny):
    reader = gguf.GGUFReader(tiny.gguf())
    cfg, arch = tiny.model.config, ARCH[tiny.spec.key]
    n_experts = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    assert field(reader, Keys.General.ARCHITECTURE) == arch
    assert field(reader, Keys.General.NAME) == "tiny"
    assert field(reader, Keys.General.FILE_TYPE) == gguf.LlamaFileType.MOSTLY_Q4_K_M
    assert field(reader, Keys.General.QUANTIZATION_VERSION) == gguf.GGML_QUANT_VERSION
    expect = {Keys.LLM.BLOCK_COUNT: cfg.num_hidden_layers, Keys.LLM.EMBEDDING_LENGTH: cfg.hidden_size,
              Keys.LLM.CONTEXT_LENGTH: cfg.max_position_embeddings, Keys.LLM.EXPERT_COUNT: n_experts,
              Keys.LLM.EXPERT_USED_COUNT: cfg.num_experts_per_tok, Keys.Attention.HEAD_COUNT: cfg.num_attention_heads,
              Keys.Attention.HEAD_COUNT_KV: cfg.num_key_value_heads}
    if arch in ("qwen2moe", "qwen3moe"):
        expect[Keys.LLM.EXPERT_FEED_FORWARD_LENGTH] = cfg.moe_intermediate_size
    if arch == "qwen2moe":
        expect[Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH] = cfg.shared_expert_intermediate_size
    if arch == "llama":
        expect[Keys.Rope.DIMENSION_COUNT] = cfg.hidden_size // cfg.num_attention_heads
    for key, value in expect.items():
        assert field(reader, key.format(arch=arch)) == value, key
    assert field(reader, Keys.Attention.LAYERNORM_RMS_EPS.format(arch=arch)) == pytest.approx(cfg.rms_norm_eps)
    assert field(reader, Keys.Rope.FREQ_BASE.format(arch=arch)) == pytest.approx(
        cfg.rope_parameters["rope_theta"])
    # Tokenizer
    assert field(reader, Keys.Tokenizer.MODEL) == "gpt2"
    assert field(reader, Keys.Tokenizer.PRE) == PRE[tiny.spec.tokenizer]
    assert len(field(reader, Keys.Tokenizer.LIST)) == cfg.vocab_size
    assert field(reader, Keys.Tokenizer.EOS_ID) == tiny.tokenizer.token_to_id("<|im_end|>")
    assert field(reader, Keys.Tokenizer.CHAT_TEMPLATE) == CHAT_TEMPLATE
    im_start = tiny.tokenizer.token_to_id("<|im_start|>")
    assert field(reader, Keys.Tokenizer.TOKEN_TYPE)[im_start] == gguf.TokenType.CONTROL


def test_expert_tensors_are_3d_expert_slowest(tiny):
    reader = gguf.GGUFReader(tiny.gguf())
    cfg = tiny.model.config
    n_experts = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    ff = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}  # ggml order, fastest first
    for bid in range(cfg.num_hidden_layers):
        assert shapes[f"blk.{bid}.ffn_gate_exps.weight"] == [cfg.hidden_size, ff, n_experts]
        assert shapes[f"blk.{bid}.ffn_up_exps.weight"] == [cfg.hidden_size, ff, n_experts]
        assert shapes[f"blk.{bid}.ffn_down_exps.weight"] == [ff, cfg.hidden_size, n_experts]


def test_per_expert_and_fused_layouts_give_identical_files(tiny):
    assert tiny.gguf(source="per_expert").read_bytes() == tiny.gguf(source="fused").read_bytes()


def test_sharded_with_and_without_index(tiny_models, tmp_path):
    from fixtures import save_checkpoint
    tiny = tiny_models["olmoe"]
    sharded = save_checkpoint(tiny.model, tiny.spec, tiny.tokenizer, tmp_path / "sharded", fused=True,
                              max_shard_size="600KB")
    assert len(list(sharded.glob("*.safetensors"))) > 1 and (sharded / "model.safetensors.index.json").exists()
    convert(sharded, tmp_path / "a.gguf", name="tiny")
    (sharded / "model.safetensors.index.json").unlink()
    convert(sharded, tmp_path / "b.gguf", name="tiny")
    reference = tiny.gguf().read_bytes()
    assert (tmp_path / "a.gguf").read_bytes() == reference
    assert (tmp_path / "b.gguf").read_bytes() == reference


def test_chat_template_from_either_file(tiny_models, tmp_path):
    # qwen fixtures keep the template in chat_template.jinja, the others in tokenizer_config.json
    for key in ("qwen2moe", "olmoe"):
        reader = gguf.GGUFReader(tiny_models[key].gguf())
        assert field(reader, Keys.Tokenizer.CHAT_TEMPLATE) == CHAT_TEMPLATE


def test_no_temp_files_left(tiny):
    tiny.gguf()
    assert not list(tiny.root.glob(".*.tmp"))


def test_progress_bar_sees_every_source_byte(tiny_models, tmp_path):
    class Bar:
        def __init__(self, total):
            self.total, self.done, self.closed = total, 0, False

        def update(self, n):
            self.done += n

        def close(self):
            self.closed = True

    bars = []
    tiny = tiny_models["qwen2moe"]
    convert(tiny.fused, tmp_path / "p.gguf", name="tiny", progress=lambda total: bars.append(Bar(total)) or bars[-1])
    (bar,) = bars
    source = sum(p.stat().st_size for p in tiny.fused.glob("*.safetensors"))
    assert bar.closed and 0.99 * source < bar.total <= source and abs(bar.done - bar.total) <= 64
