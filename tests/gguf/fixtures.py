"""Tiny GGUF model files in llama.cpp's layout and key names, written with gguf-py's GGUFWriter.

Each `write_<arch>` writes a two-layer model with random weights of real ggml types (Q8_0 and
MXFP4 through `gguf.quants.quantize`, random bytes of the right size for K-quants) and returns
the hyperparameters it wrote, as HParams field -> value. `patch_*` helpers locate fields of a
written file (through gguf-py's reader) so the malformed-file tests can corrupt exactly one.
"""
from __future__ import annotations

import shutil
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGUFReader, GGUFWriter
from gguf.constants import ExpertGatingFuncType, GGMLQuantizationType, RopeScalingType
from gguf.quants import quant_shape_to_byte_shape, quantize

Q = GGMLQuantizationType


@dataclass(frozen=True)
class Dims:
    n_layers: int = 2
    n_embd: int = 256  # a multiple of 256 so gate/up rows can be K-quants
    n_ff: int = 128
    n_ff_exp: int = 64
    n_experts: int = 4
    n_experts_used: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    vocab: int = 64
    context: int = 512


class ModelWriter:
    """GGUFWriter plus random tensors of real ggml types; `finish()` writes the file."""

    def __init__(self, path: Path, arch: str, seed: int = 0, alignment: int | None = None):
        self.path, self.w, self.rng = path, GGUFWriter(str(path), arch), np.random.default_rng(seed)
        if alignment is not None:
            self.w.add_custom_alignment(alignment)

    def f32(self, name: str, *shape: int) -> None:
        self.w.add_tensor(name, self.rng.standard_normal(shape, dtype=np.float32))

    def quant(self, name: str, qtype: GGMLQuantizationType, *shape: int) -> None:
        values = self.rng.standard_normal(shape, dtype=np.float32)
        try:
            data = quantize(values, qtype)
        except NotImplementedError:  # K-quants: random bytes of the right size
            data = self.rng.integers(0, 256, quant_shape_to_byte_shape(shape, qtype), dtype=np.uint8)
        self.w.add_tensor(name, data, raw_dtype=qtype)

    def drop_keys(self, keys: set[str]) -> None:
        for key in keys:
            del self.w.kv_data[0][key]

    def finish(self) -> Path:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()
        return self.path


def _tokenizer(mw: ModelWriter, d: Dims) -> None:
    mw.w.add_tokenizer_model("gpt2")
    mw.w.add_token_list([f"tok{i}" for i in range(d.vocab)])
    mw.w.add_token_scores([float(-i) for i in range(d.vocab)])


def _common_keys(mw: ModelWriter, d: Dims, moe: bool = True) -> None:
    w = mw.w
    w.add_context_length(d.context)
    w.add_embedding_length(d.n_embd)
    w.add_block_count(d.n_layers)
    w.add_feed_forward_length(d.n_ff)
    w.add_head_count(d.n_head)
    w.add_head_count_kv(d.n_head_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    if moe:
        w.add_expert_count(d.n_experts)
        w.add_expert_used_count(d.n_experts_used)
    _tokenizer(mw, d)


def _embeddings(mw: ModelWriter, d: Dims) -> None:
    mw.quant("token_embd.weight", Q.Q8_0, d.vocab, d.n_embd)
    mw.f32("output_norm.weight", d.n_embd)
    mw.quant("output.weight", Q.Q8_0, d.vocab, d.n_embd)


def _attention(mw: ModelWriter, d: Dims, i: int, bias: bool = False) -> None:
    q, kv = d.n_head * d.head_dim, d.n_head_kv * d.head_dim
    mw.f32(f"blk.{i}.attn_norm.weight", d.n_embd)
    mw.quant(f"blk.{i}.attn_q.weight", Q.Q8_0, q, d.n_embd)
    mw.quant(f"blk.{i}.attn_k.weight", Q.Q8_0, kv, d.n_embd)
    mw.quant(f"blk.{i}.attn_v.weight", Q.Q8_0, kv, d.n_embd)
    mw.quant(f"blk.{i}.attn_output.weight", Q.Q8_0, d.n_embd, q)
    if bias:
        mw.f32(f"blk.{i}.attn_q.bias", q)
        mw.f32(f"blk.{i}.attn_k.bias", kv)
        mw.f32(f"blk.{i}.attn_v.bias", kv)


def _experts(mw: ModelWriter, d: Dims, i: int, gate_up: GGMLQuantizationType = Q.Q4_K,
             down: GGMLQuantizationType = Q.Q8_0, fused: bool = False) -> None:
    E, H, I = d.n_experts, d.n_embd, d.n_ff_exp
    mw.f32(f"blk.{i}.ffn_norm.weight", H)
    mw.f32(f"blk.{i}.ffn_gate_inp.weight", E, H)
    if fused:
        mw.quant(f"blk.{i}.ffn_gate_up_exps.weight", gate_up, E, 2 * I, H)
    else:
        mw.quant(f"blk.{i}.ffn_gate_exps.weight", gate_up, E, I, H)
        mw.quant(f"blk.{i}.ffn_up_exps.weight", gate_up, E, I, H)
    mw.quant(f"blk.{i}.ffn_down_exps.weight", down, E, H, I)


def _expected(arch: str, d: Dims, **fields: Any) -> dict[str, Any]:
    base = dict(arch=arch, n_layers=d.n_layers, context_length=d.context, vocab_size=d.vocab, n_embd=d.n_embd,
                n_ff=d.n_ff, n_ff_exp=d.n_ff_exp, n_experts=d.n_experts, n_experts_used=d.n_experts_used,
                n_shared_experts=0, n_ff_shexp=0, n_dense_lead=0, n_head=d.n_head, n_head_kv=d.n_head_kv,
                head_dim=d.head_dim, head_dim_v=d.head_dim, rope_freq_base=1000000.0, rope_dim=d.head_dim,
                norm_eps=1e-6, expert_weights_scale=1.0)
    return {**base, **fields}


def write_mixtral(path: Path, d: Dims = Dims(), meta: Dims | None = None, drop: set[str] = frozenset()):
    """Mixtral as llama.cpp converts it: arch `llama`, n_ff is the expert width, all Q8_0."""
    d = replace(d, n_ff=d.n_ff_exp)
    mw, m = ModelWriter(path, "llama", seed=1), meta or d
    _common_keys(mw, m)
    mw.w.add_rope_dimension_count(d.head_dim)
    _embeddings(mw, d)
    for i in range(d.n_layers):
        _attention(mw, d, i)
        _experts(mw, d, i, gate_up=Q.Q8_0, down=Q.Q8_0)
    mw.drop_keys(drop)
    mw.finish()
    return _expected("llama", d, rope_type="norm", expert_weights_norm=True, expert_gating_func="softmax")


def write_qwen2moe(path: Path, d: Dims = Dims(), meta: Dims | None = None, drop: set[str] = frozenset()):
    """Qwen2-MoE: q/k/v biases, one shared expert with its own sigmoid gate."""
    mw, m, n_ff_shexp = ModelWriter(path, "qwen2moe", seed=2), meta or d, 128
    _common_keys(mw, m)
    mw.w.add_expert_feed_forward_length(m.n_ff_exp)
    mw.w.add_expert_shared_feed_forward_length(n_ff_shexp)
    _embeddings(mw, d)
    for i in range(d.n_layers):
        _attention(mw, d, i, bias=True)
        _experts(mw, d, i, gate_up=Q.Q4_K, down=Q.Q8_0)
        mw.f32(f"blk.{i}.ffn_gate_inp_shexp.weight", d.n_embd)
        mw.quant(f"blk.{i}.ffn_gate_shexp.weight", Q.Q8_0, n_ff_shexp, d.n_embd)
        mw.quant(f"blk.{i}.ffn_up_shexp.weight", Q.Q8_0, n_ff_shexp, d.n_embd)
        mw.quant(f"blk.{i}.ffn_down_shexp.weight", Q.Q8_0, d.n_embd, n_ff_shexp)
    mw.drop_keys(drop)
    mw.finish()
    return _expected("qwen2moe", d, n_shared_experts=1, n_ff_shexp=n_ff_shexp, rope_type="neox",
                     expert_weights_norm=False, expert_gating_func="softmax")


def write_qwen3moe(path: Path, d: Dims = Dims(), meta: Dims | None = None, drop: set[str] = frozenset(),
                   fused: bool = False, alignment: int | None = None):
    """Qwen3-MoE: per-head RMS norm of q and k, explicit head_dim (key/value length)."""
    mw, m = ModelWriter(path, "qwen3moe", seed=3, alignment=alignment), meta or d
    _common_keys(mw, m)
    mw.w.add_expert_feed_forward_length(m.n_ff_exp)
    mw.w.add_key_length(d.head_dim)
    mw.w.add_value_length(d.head_dim)
    mw.w.add_vocab_size(d.vocab)
    _embeddings(mw, d)
    for i in range(d.n_layers):
        _attention(mw, d, i)
        mw.f32(f"blk.{i}.attn_q_norm.weight", d.head_dim)
        mw.f32(f"blk.{i}.attn_k_norm.weight", d.head_dim)
        _experts(mw, d, i, gate_up=Q.Q4_K, down=Q.Q8_0, fused=fused)
    mw.drop_keys(drop)
    mw.finish()
    return _expected("qwen3moe", d, rope_type="neox", expert_weights_norm=True, expert_gating_func="softmax")


def write_qwen3moe_fused(path: Path, d: Dims = Dims(), **kw):
    """Qwen3-MoE with gate and up fused into ffn_gate_up_exps [E, 2I, H]."""
    return write_qwen3moe(path, d, fused=True, **kw)


def write_olmoe(path: Path, d: Dims = Dims(), meta: Dims | None = None, drop: set[str] = frozenset()):
    """OLMoE: full-width q/k norms, no expert_feed_forward_length (n_ff is the expert width)."""
    d = replace(d, n_ff=d.n_ff_exp, n_head_kv=d.n_head)
    mw, m = ModelWriter(path, "olmoe", seed=4), meta or d
    _common_keys(mw, m)
    _embeddings(mw, d)
    for i in range(d.n_layers):
        _attention(mw, d, i)
        mw.f32(f"blk.{i}.attn_q_norm.weight", d.n_head * d.head_dim)
        mw.f32(f"blk.{i}.attn_k_norm.weight", d.n_head_kv * d.head_dim)
        _experts(mw, d, i, gate_up=Q.Q4_K, down=Q.Q8_0)
    mw.drop_keys(drop)
    mw.finish()
    return _expected("olmoe", d, rope_type="neox", expert_weights_norm=False, expert_gating_func="softmax")


def write_deepseek2(path: Path, d: Dims = Dims(), meta: Dims | None = None, drop: set[str] = frozenset()):
    """DeepSeek-V3 style deepseek2: MLA, one dense lead layer, 2 shared experts, sigmoid + yarn."""
    mw, m = ModelWriter(path, "deepseek2", seed=5), meta or d
    q_lora, kv_lora, nope, rope, v = 64, 32, 32, 32, 32
    _common_keys(mw, m)
    w = mw.w
    w.add_leading_dense_block_count(1)
    w.add_expert_feed_forward_length(m.n_ff_exp)
    w.add_expert_shared_count(2)
    w.add_expert_weights_scale(2.5)
    w.add_expert_weights_norm(True)
    w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    w.add_expert_group_count(2)
    w.add_expert_group_used_count(1)
    w.add_q_lora_rank(q_lora)
    w.add_kv_lora_rank(kv_lora)
    w.add_key_length(nope + rope)
    w.add_value_length(v)
    w.add_rope_dimension_count(rope)
    w.add_rope_scaling_type(RopeScalingType.YARN)
    w.add_rope_scaling_factor(40.0)
    w.add_rope_scaling_orig_ctx_len(128)
    w.add_rope_scaling_yarn_log_mul(0.1)
    _embeddings(mw, d)
    H = d.n_embd
    for i in range(d.n_layers):
        mw.f32(f"blk.{i}.attn_norm.weight", H)
        mw.quant(f"blk.{i}.attn_q_a.weight", Q.Q8_0, q_lora, H)
        mw.f32(f"blk.{i}.attn_q_a_norm.weight", q_lora)
        mw.quant(f"blk.{i}.attn_q_b.weight", Q.Q8_0, d.n_head * (nope + rope), q_lora)
        mw.quant(f"blk.{i}.attn_kv_a_mqa.weight", Q.Q8_0, kv_lora + rope, H)
        mw.f32(f"blk.{i}.attn_kv_a_norm.weight", kv_lora)
        mw.quant(f"blk.{i}.attn_kv_b.weight", Q.Q8_0, d.n_head * (nope + v), kv_lora)
        mw.quant(f"blk.{i}.attn_output.weight", Q.Q8_0, H, d.n_head * v)
        if i == 0:  # the dense lead layer
            mw.f32(f"blk.{i}.ffn_norm.weight", H)
            mw.quant(f"blk.{i}.ffn_gate.weight", Q.Q8_0, d.n_ff, H)
            mw.quant(f"blk.{i}.ffn_up.weight", Q.Q8_0, d.n_ff, H)
            mw.quant(f"blk.{i}.ffn_down.weight", Q.Q8_0, H, d.n_ff)
            continue
        _experts(mw, d, i, gate_up=Q.Q4_K, down=Q.Q8_0)
        mw.f32(f"blk.{i}.exp_probs_b.bias", d.n_experts)
        mw.quant(f"blk.{i}.ffn_gate_shexp.weight", Q.Q8_0, 2 * d.n_ff_exp, H)
        mw.quant(f"blk.{i}.ffn_up_shexp.weight", Q.Q8_0, 2 * d.n_ff_exp, H)
        mw.quant(f"blk.{i}.ffn_down_shexp.weight", Q.Q8_0, H, 2 * d.n_ff_exp)
    mw.drop_keys(drop)
    mw.finish()
    return _expected("deepseek2", d, n_dense_lead=1, n_shared_experts=2, n_ff_shexp=2 * d.n_ff_exp,
                     head_dim=nope + rope, head_dim_v=v, rope_dim=rope, rope_type="norm",
                     expert_weights_norm=True, expert_gating_func="sigmoid", expert_weights_scale=2.5,
                     n_expert_groups=2, n_expert_groups_used=1, q_lora_rank=q_lora, kv_lora_rank=kv_lora)


def write_gpt_oss(path: Path, d: Dims = Dims(), meta: Dims | None = None, drop: set[str] = frozenset()):
    """gpt-oss: MXFP4 experts with per-expert biases, attention sinks, sliding window, yarn."""
    mw, m = ModelWriter(path, "gpt-oss", seed=6), meta or d
    _common_keys(mw, m)
    w = mw.w
    w.add_expert_feed_forward_length(m.n_ff_exp)
    w.add_key_length(d.head_dim)
    w.add_value_length(d.head_dim)
    w.add_sliding_window(128)
    w.add_rope_scaling_type(RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(256)
    _embeddings(mw, d)
    E, I = d.n_experts, d.n_ff_exp
    for i in range(d.n_layers):
        _attention(mw, d, i, bias=True)
        mw.f32(f"blk.{i}.attn_sinks.weight", d.n_head)
        mw.f32(f"blk.{i}.attn_output.bias", d.n_embd)  # llama.cpp's gpt-oss graph requires both biases
        mw.f32(f"blk.{i}.ffn_gate_inp.bias", E)
        mw.f32(f"blk.{i}.post_attention_norm.weight", d.n_embd)
        _experts(mw, d, i, gate_up=Q.MXFP4, down=Q.MXFP4)
        mw.f32(f"blk.{i}.ffn_gate_exps.bias", E, I)
        mw.f32(f"blk.{i}.ffn_up_exps.bias", E, I)
        mw.f32(f"blk.{i}.ffn_down_exps.bias", E, d.n_embd)
    mw.drop_keys(drop)
    mw.finish()
    return _expected("gpt-oss", d, rope_type="neox", expert_weights_norm=False,
                     expert_gating_func="softmax_weight", sliding_window=128)


#: Fixture name -> writer. Every writer takes (path, dims, meta=dims written as metadata, drop=keys).
WRITERS: dict[str, Callable[..., dict[str, Any]]] = {
    "mixtral": write_mixtral,
    "qwen2moe": write_qwen2moe,
    "qwen3moe": write_qwen3moe,
    "qwen3moe-fused": write_qwen3moe_fused,
    "olmoe": write_olmoe,
    "deepseek2": write_deepseek2,
    "gpt-oss": write_gpt_oss,
}


# -- byte patching for the malformed-file corpus ------------------------------------------------

def copy(src: Path, dst: Path) -> Path:
    shutil.copyfile(src, dst)
    return dst


def patch(path: Path, offset: int, fmt: str, value: Any) -> Path:
    """Overwrite the little-endian field `fmt` at `offset`."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack("<" + fmt, value))
    return path


def kv_value_offset(path: Path, key: str) -> int:
    """Offset of the value of metadata `key` (after its key string and u32 value type)."""
    field = GGUFReader(path).fields[key]
    return field.offset + 8 + len(key.encode()) + 4


def tensor_field_offsets(path: Path, name: str) -> dict[str, int]:
    """Offsets of the `ne0`, `type` and `offset` fields of tensor `name`'s header record."""
    t = next(t for t in GGUFReader(path).tensors if t.name == name)
    dims = t.field.offset + 8 + len(name.encode()) + 4
    ggml_type = dims + 8 * len(t.shape)
    return {"ne0": dims, "type": ggml_type, "offset": ggml_type + 4}


def data_offset(path: Path) -> int:
    return GGUFReader(path).data_offset


def truncate(path: Path, size: int) -> Path:
    with open(path, "r+b") as f:
        f.truncate(size)
    return path
