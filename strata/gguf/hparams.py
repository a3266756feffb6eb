"""Model hyperparameters of the MoE architectures Strata runs, read from GGUF metadata.

Key names come from gguf-py's `Keys` (the names llama.cpp's converter writes and its loader
reads); defaults for absent optional keys follow llama.cpp's loader and, where they differ by
architecture, come from the architecture's `strata.arch` record, so a file means the same thing
here as there. Values a key does not give are derived from tensor shapes where llama.cpp
derives them too (vocabulary from the embedding, expert FFN length from the expert tensors).

Must not read tensor data or import torch: metadata and tensor shapes only.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from gguf.constants import MODEL_TENSOR, Keys, RopeScalingType

from strata import arch as archs
from strata.arch import Arch, weight_name, weight_pattern

from .experts import ff_length_from_shape, match_expert_tensor
from .header import format_error
from .indexer import INDEXER_TYPES, IndexerDims, read_indexer


#: `{arch}.expert_gating_func` values (llama.cpp's llama_expert_gating_func_type) by id; 0 ("none")
#: means the architecture's default, as llama.cpp's deepseek2 loader reads it. gguf-py's
#: ExpertGatingFuncType lacks SOFTMAX_WEIGHT (3), so the table is llama.cpp's, checked against it.
GATING_FUNCS: dict[int, str] = {0: "none", 1: "softmax", 2: "sigmoid", 3: "softmax_weight", 4: "sqrtsoftplus"}
SUPPORTED_GATING = ("softmax", "sigmoid", "softmax_weight")  # what strata.models.moe.Router computes
DEFAULT_ROPE_FREQ_BASE = 10000.0  # llama.cpp's default when rope.freq_base is absent


@dataclass(frozen=True)
class RopeScaling:
    """RoPE context extension; keys `{arch}.rope.scaling.*`. Yarn fields are None when absent."""

    type: str = RopeScalingType.NONE.value  # .type: none | linear | yarn | longrope
    factor: float = 1.0  # .factor (absent or 0 -> 1.0)
    original_context_length: int = 0  # .original_context_length (absent -> context_length)
    attn_factor: float | None = None  # .attn_factor
    yarn_ext_factor: float | None = None  # .yarn_ext_factor
    yarn_attn_factor: float | None = None  # .yarn_attn_factor
    yarn_beta_fast: float | None = None  # .yarn_beta_fast
    yarn_beta_slow: float | None = None  # .yarn_beta_slow
    yarn_log_multiplier: float | None = None  # .yarn_log_multiplier


@dataclass(frozen=True)
class HParams:
    """Hyperparameters of one model file. Each field names its key (`{arch}.` prefix omitted).

    Absent optional keys take llama.cpp's defaults; "req" marks keys whose absence is an error.
    """

    arch: str  # general.architecture (req)
    n_layers: int  # block_count (req) less nextn_predict_layers: the trunk's blocks, the ones that run
    context_length: int  # context_length (req)
    vocab_size: int  # vocab_size, else rows of token_embd.weight, else len(tokenizer.ggml.tokens)
    n_embd: int  # embedding_length (req)
    n_ff: int  # feed_forward_length: dense FFN width (0 if absent)
    n_ff_exp: int  # expert_feed_forward_length, else from the expert tensors' shape (0 if none)
    n_experts: int  # expert_count (req for MoE architectures; 0 for a dense llama)
    n_experts_used: int  # expert_used_count (req for MoE architectures)
    n_shared_experts: int  # expert_shared_count, else 1 if shared-expert tensors exist, else 0
    n_ff_shexp: int  # expert_shared_feed_forward_length, else rows of ffn_up_shexp (all shared experts)
    n_dense_lead: int  # leading_dense_block_count (0)
    n_head: int  # attention.head_count (req)
    n_head_kv: int  # attention.head_count_kv (n_head)
    head_dim: int  # attention.key_length (n_embd // n_head)
    head_dim_v: int  # attention.value_length (head_dim)
    rope_freq_base: float  # rope.freq_base (10000)
    rope_type: str  # not stored: the architecture's ("norm" or "neox", as llama.cpp's graph uses it)
    rope_dim: int  # rope.dimension_count (head_dim)
    rope_scaling: RopeScaling  # rope.scaling.*
    norm_eps: float  # attention.layer_norm_rms_epsilon (req)
    expert_weights_norm: bool  # expert_weights_norm (the architecture's default when absent)
    expert_gating_func: str  # expert_gating_func: softmax | sigmoid (| softmax_weight for gpt-oss)
    expert_weights_scale: float  # expert_weights_scale (1.0)
    n_expert_groups: int = 0  # expert_group_count (deepseek2 / V3 group-limited routing)
    n_expert_groups_used: int = 0  # expert_group_used_count
    q_lora_rank: int = 0  # attention.q_lora_rank (deepseek2; 0 = no query compression)
    kv_lora_rank: int = 0  # attention.kv_lora_rank (req for deepseek2)
    head_dim_mla: int = 0  # attention.key_length_mla (deepseek2, newer converters)
    head_dim_v_mla: int = 0  # attention.value_length_mla
    sliding_window: int = 0  # attention.sliding_window (req for gpt-oss)
    swa_layers: tuple[bool, ...] = ()  # attention.sliding_window_pattern: per layer, or a period (the arch's)
    rope_freq_base_swa: float = 0.0  # rope.freq_base_swa: sliding-window layers' base (rope.freq_base)
    attn_temperature_scale: float = 0.0  # attention.temperature_scale (deepseek2; 0: none)
    attn_temperature_length: int = 0  # attention.temperature_length (req with a temperature scale)
    n_layers_nextn: int = 0  # nextn_predict_layers: multi-token-prediction blocks after the trunk (not run)
    attn_chunk: int = 0  # attention.sliding_window of chunked attention (Arch.chunked): local layers' chunk
    nope_layers: tuple[bool, ...] = ()  # per layer: no RoPE, full attention, temperature-tuned queries (chunked)
    qk_l2_norm: bool = False  # an L2 norm of q and k after RoPE on RoPE layers (chunked, by expert count)
    ssm: "DeltaNetDims | None" = None  # gated DeltaNet layers' sizes (Arch.gated_deltanet), else None
    recurrent_layers: tuple[bool, ...] = ()  # attention.recurrent_layers, else all but every full_attention_interval-th
    rope_sections: tuple[int, ...] = ()  # rope.dimension_sections (t, h, w, e) of interleaved multimodal RoPE
    indexer: "IndexerDims | None" = None  # DeepSeek Sparse Attention's lightning indexer (Arch.indexer_rope), else None
    heads: tuple[int, ...] = ()  # attention.head_count as an array: each trunk layer's query heads (else n_head)
    kv_heads: tuple[int, ...] = ()  # attention.head_count_kv as an array: each trunk layer's kv heads (else n_head_kv)
    attn_value_scale: float = 1.0  # attention.value_scale: the attention's values (its output) scaled (mimo2)
    rope_dim_swa: int = 0  # rope.dimension_count_swa: sliding-window layers' rotary features (rope_dim)

    def head_count(self, layer: int) -> int:
        """Layer `layer`'s query heads (llama.cpp's n_head(il)): its entry of a per-layer array, else n_head."""
        return self.heads[layer] if self.heads else self.n_head

    def head_count_kv(self, layer: int) -> int:
        """Layer `layer`'s kv heads (llama.cpp's n_head_kv(il)): its entry of a per-layer array, else n_head_kv."""
        return self.kv_heads[layer] if self.kv_heads else self.n_head_kv

    def is_nope(self, layer: int) -> bool:
        """Whether `layer` is a global NoPE layer of chunked attention (llama.cpp's !use_rope)."""
        return layer < len(self.nope_layers) and self.nope_layers[layer]

    def is_recurrent(self, layer: int) -> bool:
        """Whether `layer` is a gated DeltaNet (linear attention) layer (llama.cpp's hparams.is_recr)."""
        return layer < len(self.recurrent_layers) and self.recurrent_layers[layer]

    def is_swa(self, layer: int) -> bool:
        """Whether `layer` attends within the sliding window (llama.cpp's hparams.is_swa)."""
        return bool(self.sliding_window) and layer < len(self.swa_layers) and self.swa_layers[layer]


@dataclass(frozen=True)
class DeltaNetDims:
    """Sizes of a gated DeltaNet layer, from `ssm.*` (llama.cpp's qwen3next names): conv_kernel K,
    state_size = key (and value) head dim, group_count = key heads, time_step_rank = value heads,
    inner_size = value heads x value head dim."""

    conv_kernel: int
    head_k_dim: int
    n_k_heads: int
    n_v_heads: int
    inner_size: int

    @property
    def head_v_dim(self) -> int:
        return self.inner_size // self.n_v_heads

    @property
    def conv_channels(self) -> int:
        """Channels of the short convolution: [q | k | v]."""
        return 2 * self.n_k_heads * self.head_k_dim + self.inner_size


_REQUIRED = object()
_KIND_NAMES = {int: "an integer", float: "a number", bool: "a bool", str: "a string"}


class _Metadata:
    """Typed access to `{arch}.*` keys with the file named in every error."""

    def __init__(self, path: Path, metadata: Mapping[str, Any], arch: str):
        self.path, self.metadata, self.arch = path, metadata, arch

    def get(self, template: str, kind: type, default: Any = _REQUIRED) -> Any:
        key = template.format(arch=self.arch)
        if key not in self.metadata:
            if default is _REQUIRED:
                raise format_error(self.path, f"metadata key {key!r}",
                                   f"{_KIND_NAMES[kind]} (required for {self.arch})", "no such key")
            return default
        return _coerce(self.path, key, self.metadata[key], kind)


def _coerce(path: Path, key: str, value: Any, kind: type) -> Any:
    if isinstance(value, list) and kind is not list and value and all(v == value[0] for v in value):
        value = value[0]  # a per-layer array with one value for every layer
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise format_error(path, f"metadata key {key!r}", _KIND_NAMES[kind], f"{value!r:.80}")
    return value


def read_hparams(path: Path, metadata: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> HParams:
    """HParams of a file from its metadata and tensor shapes (row-major), validated."""
    arch = architecture(path, metadata)
    spec, m = archs.get(arch), _Metadata(path, metadata, arch)
    L, A = Keys.LLM, Keys.Attention
    n_embd = m.get(L.EMBEDDING_LENGTH, int)
    n_nextn = m.get(L.NEXTN_PREDICT_LAYERS, int, 0)
    n_layers = m.get(L.BLOCK_COUNT, int) - n_nextn  # llama.cpp's n_layer(): MTP blocks are not the trunk's
    heads = _per_layer_counts(m, A.HEAD_COUNT, n_layers, n_nextn)
    n_head = m.get(A.HEAD_COUNT, int) if heads is None else heads[0]  # llama.cpp's n_head(): the first layer's
    if n_head <= 0:
        raise format_error(path, f"metadata key {A.HEAD_COUNT.format(arch=arch)!r}", "> 0", str(n_head))
    n_experts = m.get(L.EXPERT_COUNT, int, _REQUIRED if spec.moe else 0)
    head_dim = m.get(A.KEY_LENGTH, int, n_embd // n_head)
    context_length = m.get(L.CONTEXT_LENGTH, int)
    n_shared = m.get(L.EXPERT_SHARED_COUNT, int, 1 if _shexp_rows(shapes) else 0)
    sliding_window = m.get(A.SLIDING_WINDOW, int, 0 if spec.swa_optional else _REQUIRED) if spec.swa else 0
    rope_dim = m.get(Keys.Rope.DIMENSION_COUNT, int, head_dim)
    rope_freq_base = m.get(Keys.Rope.FREQ_BASE, float, DEFAULT_ROPE_FREQ_BASE)
    kv_heads = _per_layer_counts(m, A.HEAD_COUNT_KV, n_layers, n_nextn)
    # llama.cpp reads the temperature keys for deepseek2 only (Mistral-Large-3's query temperature)
    temp_scale = m.get(A.TEMPERATURE_SCALE, float, 0.0) if spec.mla else 0.0
    hp = HParams(
        arch=arch,
        n_layers=n_layers,
        context_length=context_length,
        vocab_size=_vocab_size(path, m, shapes),
        n_embd=n_embd,
        n_ff=m.get(L.FEED_FORWARD_LENGTH, int, 0),
        n_ff_exp=m.get(L.EXPERT_FEED_FORWARD_LENGTH, int, _expert_ff_from_shapes(shapes)),
        n_experts=n_experts,
        n_experts_used=m.get(L.EXPERT_USED_COUNT, int, _REQUIRED if spec.moe else 0),
        n_shared_experts=n_shared,
        n_ff_shexp=m.get(L.EXPERT_SHARED_FEED_FORWARD_LENGTH, int, _shexp_rows(shapes)),
        n_dense_lead=m.get(L.LEADING_DENSE_BLOCK_COUNT, int, _REQUIRED if spec.dense_lead else 0),
        n_head=n_head,
        n_head_kv=m.get(A.HEAD_COUNT_KV, int, n_head) if kv_heads is None else max(kv_heads),
        head_dim=head_dim,
        head_dim_v=m.get(A.VALUE_LENGTH, int, head_dim),
        rope_freq_base=rope_freq_base,
        rope_type=spec.rope_type,
        rope_dim=rope_dim,
        rope_scaling=_rope_scaling(m, context_length),
        norm_eps=m.get(A.LAYERNORM_RMS_EPS, float),
        expert_weights_norm=m.get(L.EXPERT_WEIGHTS_NORM, bool, spec.expert_weights_norm),
        expert_gating_func=_gating_func(m, spec),
        expert_weights_scale=m.get(L.EXPERT_WEIGHTS_SCALE, float, 1.0),
        n_expert_groups=m.get(L.EXPERT_GROUP_COUNT, int, 0),
        n_expert_groups_used=m.get(L.EXPERT_GROUP_USED_COUNT, int, 0),
        q_lora_rank=m.get(A.Q_LORA_RANK, int, 0),
        kv_lora_rank=m.get(A.KV_LORA_RANK, int, _REQUIRED if spec.mla else 0),
        head_dim_mla=m.get(A.KEY_LENGTH_MLA, int, 0),
        head_dim_v_mla=m.get(A.VALUE_LENGTH_MLA, int, 0),
        sliding_window=sliding_window,
        swa_layers=_swa_layers(m, spec, n_layers) if spec.swa and (sliding_window or not spec.swa_optional) else (),
        rope_freq_base_swa=m.get(Keys.Rope.FREQ_BASE_SWA, float, rope_freq_base) if spec.swa else rope_freq_base,
        attn_temperature_scale=temp_scale,
        attn_temperature_length=m.get(A.TEMPERATURE_LENGTH, int, _REQUIRED if temp_scale else 0) if spec.mla else 0,
        n_layers_nextn=n_nextn,
        heads=heads or (),
        kv_heads=kv_heads or (),
        attn_value_scale=m.get(VALUE_SCALE, float, 1.0),
        rope_dim_swa=m.get(Keys.Rope.DIMENSION_COUNT_SWA, int, rope_dim) if spec.swa else rope_dim,
    )
    if spec.chunked:
        hp = _chunked(m, spec, hp)
    if spec.gated_deltanet:
        hp = _deltanet(m, hp)
    if spec.rope_sections:
        hp = dataclasses.replace(hp, rope_sections=_rope_sections(m))
    if spec.indexer_rope:
        hp = dataclasses.replace(hp, indexer=read_indexer(m, hp))
    _check_counts(path, hp, spec)
    _check_values(path, hp)
    return hp


def _chunked(m: _Metadata, spec: Arch, hp: HParams) -> HParams:
    """Chunked attention's fields (Arch.chunked): the chunk from `attention.sliding_window` (0: no
    chunks, RoPE on all layers but the last, as llama.cpp reads it), the NoPE layers, the query
    temperature on them and the L2 qk-norm."""
    c, A = spec.chunked, Keys.Attention
    chunk = m.get(A.SLIDING_WINDOW, int, c.chunk)
    if chunk < 0:
        raise format_error(m.path, f"metadata key {A.SLIDING_WINDOW.format(arch=m.arch)!r}", ">= 0", str(chunk))
    period = c.nope_period if chunk else hp.n_layers
    scale = m.get(A.TEMPERATURE_SCALE, float, c.temperature_scale) if chunk else 0.0
    floor = m.get(A.TEMPERATURE_LENGTH, int, c.temperature_floor) if chunk else 0
    if scale and floor <= 0:
        raise format_error(m.path, f"metadata key {A.TEMPERATURE_LENGTH.format(arch=m.arch)!r}", "> 0", str(floor))
    return dataclasses.replace(hp, attn_chunk=chunk, nope_layers=tuple((i + 1) % period == 0 for i in range(hp.n_layers)),
                               qk_l2_norm=hp.n_experts != c.no_qk_norm_experts,
                               attn_temperature_scale=scale, attn_temperature_length=floor)


def _deltanet(m: _Metadata, hp: HParams) -> HParams:
    """Gated DeltaNet sizes and which layers are recurrent (`attention.recurrent_layers`, else all
    but every `full_attention_interval`-th, default 4, as llama.cpp's qwen3next loader reads them)."""
    S = Keys.SSM
    dims = DeltaNetDims(m.get(S.CONV_KERNEL, int), m.get(S.STATE_SIZE, int), m.get(S.GROUP_COUNT, int),
                        m.get(S.TIME_STEP_RANK, int), m.get(S.INNER_SIZE, int))
    if min(dims.conv_kernel, dims.n_k_heads, dims.n_v_heads, dims.head_k_dim) < 1 or dims.n_v_heads % dims.n_k_heads \
            or dims.inner_size % dims.n_v_heads:
        raise format_error(m.path, f"metadata keys {m.arch}.ssm.*", "positive sizes, value heads a multiple of key "
                           "heads and inner_size of value heads", str(dims))
    key = RECURRENT_LAYERS.format(arch=m.arch)
    flags = m.metadata.get(key)
    if flags is None:
        period = m.get(Keys.LLM.FULL_ATTENTION_INTERVAL, int, 4)
        if period < 1:
            raise format_error(m.path, f"metadata key {Keys.LLM.FULL_ATTENTION_INTERVAL.format(arch=m.arch)!r}", "> 0",
                               str(period))
        flags = [(i + 1) % period != 0 for i in range(hp.n_layers)]
    elif not isinstance(flags, list) or len(flags) < hp.n_layers:
        raise format_error(m.path, f"metadata key {key!r}", f"an array of {hp.n_layers} bools", f"{flags!r:.80}")
    return dataclasses.replace(hp, ssm=dims, recurrent_layers=tuple(bool(f) for f in flags[:hp.n_layers]))


def _rope_sections(m: _Metadata) -> tuple[int, ...]:
    """`rope.dimension_sections`: 4 non-negative rotary-pair counts (llama.cpp's loader requires the
    key). Text positions are equal in every section, so they only need to be well formed here."""
    key = Keys.Rope.DIMENSION_SECTIONS.format(arch=m.arch)
    value = m.metadata.get(key)
    if not isinstance(value, list) or not 3 <= len(value) <= 4 or not all(isinstance(v, int) and v >= 0 for v in value):
        raise format_error(m.path, f"metadata key {key!r}", "an array of 4 non-negative integers", f"{value!r:.80}")
    return tuple(value) + (0,) * (4 - len(value))


#: llama.cpp's LLM_KV_ATTENTION_RECURRENT_LAYERS (gguf-py 0.19's Keys lacks it).
RECURRENT_LAYERS = "{arch}.attention.recurrent_layers"
#: llama.cpp's LLM_KV_ATTENTION_VALUE_SCALE (gguf-py 0.19's Keys lacks it).
VALUE_SCALE = "{arch}.attention.value_scale"


def _per_layer_counts(m: _Metadata, template: str, n_layers: int, n_nextn: int) -> tuple[int, ...] | None:
    """A count stored as one value per block (llama.cpp's get_key_or_arr: block_count entries, MTP
    blocks included), as the trunk's tuple; None when the key is absent, one value or all equal."""
    key = template.format(arch=m.arch)
    raw = m.metadata.get(key)
    if not isinstance(raw, list) or (raw and all(v == raw[0] for v in raw)):
        return None
    if len(raw) != n_layers + n_nextn or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in raw):
        raise format_error(m.path, f"metadata key {key!r}", f"one positive count per block ({n_layers + n_nextn})",
                           f"{raw!r:.80}")
    return tuple(raw[:n_layers])


def architecture(path: Path, metadata: Mapping[str, Any]) -> str:
    """`general.architecture`, which must be a registered architecture (`strata.arch`)."""
    key = Keys.General.ARCHITECTURE
    arch = metadata.get(key)
    if arch is None:
        raise format_error(path, f"metadata key {key!r}", "the model architecture", "no such key")
    if archs.get(arch) is None:
        raise format_error(path, f"metadata key {key!r}", f"one of {archs.names()}", repr(arch))
    return arch


def _vocab_size(path: Path, m: _Metadata, shapes: Mapping[str, tuple[int, ...]]) -> int:
    embd = shapes.get(weight_name(MODEL_TENSOR.TOKEN_EMBD))
    tokens = m.metadata.get(Keys.Tokenizer.LIST)
    fallback = embd[0] if embd else (len(tokens) if isinstance(tokens, list) else _REQUIRED)
    return m.get(Keys.LLM.VOCAB_SIZE, int, fallback)


def _expert_ff_from_shapes(shapes: Mapping[str, tuple[int, ...]]) -> int:
    for name, shape in shapes.items():
        hit = match_expert_tensor(name)
        if hit:
            return ff_length_from_shape(hit[0], shape) or 0
    return 0


def _shexp_rows(shapes: Mapping[str, tuple[int, ...]]) -> int:
    """Rows of the first layer's ffn_up_shexp ([I_shared, H]), 0 if the model has no shared expert."""
    pattern = weight_pattern(MODEL_TENSOR.FFN_UP_SHEXP)
    for name, shape in shapes.items():
        if pattern.match(name) and len(shape) == 2:
            return shape[0]
    return 0


def _rope_scaling(m: _Metadata, context_length: int) -> RopeScaling:
    R = Keys.Rope
    kind = m.get(R.SCALING_TYPE, str, RopeScalingType.NONE.value)
    known = [t.value for t in RopeScalingType]
    if kind not in known:
        raise format_error(m.path, f"metadata key {R.SCALING_TYPE.format(arch=m.arch)!r}", f"one of {known}",
                           repr(kind))
    return RopeScaling(
        type=kind,
        factor=m.get(R.SCALING_FACTOR, float, 0.0) or 1.0,
        original_context_length=m.get(R.SCALING_ORIG_CTX_LEN, int, context_length),
        attn_factor=m.get(R.SCALING_ATTN_FACTOR, float, None),
        yarn_ext_factor=m.get(R.SCALING_YARN_EXT_FACTOR, float, None),
        yarn_attn_factor=m.get(R.SCALING_YARN_ATTN_FACTOR, float, None),
        yarn_beta_fast=m.get(R.SCALING_YARN_BETA_FAST, float, None),
        yarn_beta_slow=m.get(R.SCALING_YARN_BETA_SLOW, float, None),
        yarn_log_multiplier=m.get(R.SCALING_YARN_LOG_MUL, float, None),
    )


def _gating_func(m: _Metadata, spec: Arch) -> str:
    key = Keys.LLM.EXPERT_GATING_FUNC.format(arch=m.arch)
    raw = m.get(Keys.LLM.EXPERT_GATING_FUNC, int, 0)
    name = GATING_FUNCS.get(raw)
    if name is None or name not in SUPPORTED_GATING + ("none",):
        want = ", ".join(f"{i} ({n})" for i, n in GATING_FUNCS.items() if n in SUPPORTED_GATING + ("none",))
        found = f"{raw} ({name}, not supported)" if name else str(raw)
        raise format_error(m.path, f"metadata key {key!r}", f"one of {want}", found)
    return spec.expert_gating_func if name == "none" else name


def _swa_layers(m: _Metadata, spec: Arch, n_layers: int) -> tuple[bool, ...]:
    """Which layers use the sliding window: `attention.sliding_window_pattern` as one bool per
    layer, or as a period n (layer i slides when i % n < n - 1, or with `Arch.swa_full_first` when
    i % n != 0; 0: every layer), else the architecture's period, as llama.cpp's load_swa_pattern
    reads it."""
    key = Keys.Attention.SLIDING_WINDOW_PATTERN.format(arch=m.arch)
    raw = m.metadata.get(key, spec.swa_period)
    full_first = spec.swa_full_first and not isinstance(raw, list)
    if isinstance(raw, list):  # bools, or 0/1 (mimo2's converter writes the checkpoint's hybrid_layer_pattern)
        # one per trunk layer, or per block with the MTP blocks after the trunk (llama.cpp reads the first n_layer)
        n_blocks = n_layers + m.get(Keys.LLM.NEXTN_PREDICT_LAYERS, int, 0)
        if len(raw) not in (n_layers, n_blocks) or not all(isinstance(v, bool) or v in (0, 1) for v in raw):
            raise format_error(m.path, f"metadata key {key!r}", f"{n_layers} bools (one per layer) or a period",
                               f"{raw!r:.80}")
        return tuple(bool(v) for v in raw[:n_layers])
    n = _coerce(m.path, key, raw, int)
    if n < 0:
        raise format_error(m.path, f"metadata key {key!r}", "a period >= 0", str(n))
    if full_first:  # llama.cpp's dense_first: layer 0 of each period attends in full
        return tuple(n == 0 or i % n != 0 for i in range(n_layers))
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layers))


def _check_counts(path: Path, hp: HParams, spec: Arch) -> None:
    key = Keys.LLM.EXPERT_COUNT.format(arch=hp.arch)
    if spec.moe and hp.n_experts <= 0:
        raise format_error(path, f"metadata key {key!r}", f"> 0 for {hp.arch}", str(hp.n_experts))
    if hp.n_experts and not 0 < hp.n_experts_used <= hp.n_experts:
        raise format_error(path, f"metadata key {Keys.LLM.EXPERT_USED_COUNT.format(arch=hp.arch)!r}",
                           f"between 1 and expert_count={hp.n_experts}", str(hp.n_experts_used))
    if hp.n_layers_nextn < 0 or hp.n_layers <= 0:
        raise format_error(path, f"metadata key {Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=hp.arch)!r}",
                           f"between 0 and block_count-1={hp.n_layers + hp.n_layers_nextn - 1}", str(hp.n_layers_nextn))
    if not 0 <= hp.n_dense_lead <= hp.n_layers:
        raise format_error(path, f"metadata key {Keys.LLM.LEADING_DENSE_BLOCK_COUNT.format(arch=hp.arch)!r}",
                           f"between 0 and block_count={hp.n_layers}", str(hp.n_dense_lead))
    _check_groups(path, hp)


def _check_groups(path: Path, hp: HParams) -> None:
    """Expert groups as llama.cpp's loader asserts them: fewer groups than experts; with more
    than one group, the experts split evenly and 0 < groups used < groups."""
    G, Gu, key = hp.n_expert_groups, hp.n_expert_groups_used, Keys.LLM.EXPERT_GROUP_COUNT.format(arch=hp.arch)
    if G and not (G < hp.n_experts or G == hp.n_experts == 1):
        raise format_error(path, f"metadata key {key!r}", f"fewer than expert_count={hp.n_experts}", str(G))
    if G > 1 and hp.n_experts % G:
        raise format_error(path, f"metadata key {key!r}", f"a divisor of expert_count={hp.n_experts}", str(G))
    if G > 1 and not 0 < Gu < G:
        raise format_error(path, f"metadata key {Keys.LLM.EXPERT_GROUP_USED_COUNT.format(arch=hp.arch)!r}",
                           f"between 1 and expert_group_count-1={G - 1}", str(Gu))


def _check_values(path: Path, hp: HParams) -> None:
    """Refuse values that would crash the forward pass or silently give garbage (NaN, infinite,
    zero or negative scales; a rotary dimension the heads cannot hold)."""
    L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
    positive = [(R.FREQ_BASE, hp.rope_freq_base), (A.LAYERNORM_RMS_EPS, hp.norm_eps),
                (L.EXPERT_WEIGHTS_SCALE, hp.expert_weights_scale), (R.SCALING_FACTOR, hp.rope_scaling.factor),
                (R.SCALING_ORIG_CTX_LEN, hp.rope_scaling.original_context_length),
                (L.CONTEXT_LENGTH, hp.context_length), (L.BLOCK_COUNT, hp.n_layers),
                (L.EMBEDDING_LENGTH, hp.n_embd), (A.HEAD_COUNT_KV, hp.n_head_kv), (A.KEY_LENGTH, hp.head_dim),
                (A.VALUE_LENGTH, hp.head_dim_v), (VALUE_SCALE, hp.attn_value_scale)]
    r = hp.rope_scaling
    positive += [(key, v) for key, v in ((R.SCALING_ATTN_FACTOR, r.attn_factor), (R.SCALING_YARN_ATTN_FACTOR,
                 r.yarn_attn_factor), (R.FREQ_BASE_SWA, hp.rope_freq_base_swa)) if v is not None]
    if hp.sliding_window or any(hp.swa_layers):
        positive.append((A.SLIDING_WINDOW, hp.sliding_window))
    if hp.attn_temperature_scale:
        positive.append((A.TEMPERATURE_LENGTH, hp.attn_temperature_length))
    finite = [(A.TEMPERATURE_SCALE, hp.attn_temperature_scale), (R.SCALING_YARN_EXT_FACTOR, r.yarn_ext_factor),
              (R.SCALING_YARN_BETA_FAST, r.yarn_beta_fast),
              (R.SCALING_YARN_BETA_SLOW, r.yarn_beta_slow), (R.SCALING_YARN_LOG_MUL, r.yarn_log_multiplier)]
    for key, value in positive:
        if not (math.isfinite(value) and value > 0):
            raise format_error(path, f"metadata key {key.format(arch=hp.arch)!r}", "a finite number > 0", repr(value))
    for key, value in finite:
        if value is not None and not math.isfinite(value):
            raise format_error(path, f"metadata key {key.format(arch=hp.arch)!r}", "a finite number", repr(value))
    for key, dim in ((R.DIMENSION_COUNT, hp.rope_dim), (R.DIMENSION_COUNT_SWA, hp.rope_dim_swa or hp.rope_dim)):
        if not (0 < dim <= hp.head_dim and dim % 2 == 0):
            raise format_error(path, f"metadata key {key.format(arch=hp.arch)!r}",
                               f"an even number in 2..head_dim={hp.head_dim}", str(dim))
    per_layer = hp.heads or hp.kv_heads  # arrays as long as the metadata's (not block_count, which may be wild)
    for i in range(len(per_layer)) if per_layer else (0,):  # each layer's kv heads divide its query heads
        n_head, kv = hp.head_count(i), hp.head_count_kv(i)
        if n_head % kv:
            where = f" (layer {i})" if per_layer else ""
            raise format_error(path, f"metadata key {A.HEAD_COUNT_KV.format(arch=hp.arch)!r}",
                               f"{'divisors' if hp.kv_heads else 'a divisor'} of head_count={n_head}{where}",
                               str(list(hp.kv_heads) or hp.n_head_kv))


__all__ = ["INDEXER_TYPES", "RECURRENT_LAYERS", "VALUE_SCALE", "DeltaNetDims", "HParams", "IndexerDims", "RopeScaling",
           "architecture", "read_hparams"]
