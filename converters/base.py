"""One converter for every architecture: hyperparameters, metadata, tensor planning, shape checks.

What differs between architectures is data in their `strata.arch` record (HF names, extra
metadata keys, q/k norms, biases, shared experts, the llama Q/K row permutation, refused config
keys); this module reads it and never names an architecture. In particular:

  * resident tensors are named through gguf-py's `TensorNameMap` (llama.cpp's own table) for the
    record's `tensors` architecture (narrowed to its `tensor_set` where it has one:
    `strata.arch.tensor_name_map`); GGUF names are formatted by `strata.arch.tensor_names`;
  * routed experts are found in either HF layout (`converters.experts`) and planned as 3-D
    `blk.N.ffn_{gate,up,down}_exps` [E, rows, cols] with the expert index slowest, produced one
    expert at a time;
  * the plan is checked completely (unexpected, missing, mis-shaped tensors) before a byte is written.

No file output here (`writer`), no tokenizer (`tokenizer`), no quantization (`types`).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np
from gguf import MODEL_TENSOR as MT
from gguf.constants import Keys

from converters.rope_scaling import rope_factor_tensors, write_rope_scaling
from converters.experts import ExpertSource, FusedSource, PerExpertSource, match_fused, match_per_expert
from converters.source import Checkpoint, ConversionError, SourceTensor
from converters.types import TypePolicy
from strata.arch import Arch, layer_of, tensor_kinds, tensor_name_map, weight_name
from strata.gguf import EXPERT_TENSORS, PARTS

log = logging.getLogger("strata.convert")

_REQUIRED = object()

#: Per-layer tensors every architecture has (experts are checked separately); the record adds more.
_LAYER_TENSORS = (MT.ATTN_NORM, MT.ATTN_Q, MT.ATTN_K, MT.ATTN_V, MT.ATTN_OUT, MT.FFN_NORM, MT.FFN_GATE_INP)
_SHARED_TENSORS = (MT.FFN_GATE_SHEXP, MT.FFN_UP_SHEXP, MT.FFN_DOWN_SHEXP)
_EXPERT_PARTS = {part: EXPERT_TENSORS[part] for part in PARTS}  # gate, up, down: GGUF order

#: Tensors some checkpoints carry that no GGUF file holds.
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.attn\.bias|\.masked_bias)$")


@dataclass
class HParams:
    """The hyperparameters every MoE architecture here has, read from config.json."""
    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_vocab: int
    n_ctx: int
    n_ff: int
    n_experts: int
    n_experts_used: int
    n_ff_exp: int
    rope_theta: float
    rms_eps: float
    tied_embeddings: bool
    n_ff_shexp: int = 0  # shared_expert_intermediate_size, where the architecture has a shared expert


@dataclass
class PlannedTensor:
    """One GGUF tensor: its name, row-major shape, type and the pieces that produce its values.

    `pieces` are called in order; each returns float32 values whose concatenation along the
    slowest dimension is the whole tensor (one expert per piece for 3-D expert tensors), or
    uint8 rows already encoded as `ggml_type` (written as they are)."""
    name: str
    kind: MT
    layer: int | None
    shape: tuple[int, ...]
    ggml_type: gguf.GGMLQuantizationType
    pieces: list[Callable[[], np.ndarray]]
    src_bytes: int
    sources: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        elems, size = gguf.GGML_QUANT_SIZES[self.ggml_type]
        return int(np.prod(self.shape, dtype=np.int64)) // elems * size


def permute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder rows (or bias entries) of a Q/K projection from half-split to interleaved rotary
    pairs: per head, rows [0..d/2) and [d/2..d) become 0, d/2, 1, d/2+1, ... (`Arch.permute_qk`:
    ggml's NORM RoPE on the result equals the checkpoint's rotate-half RoPE, as llama.cpp's
    converter does for `llama`)."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class Converter:
    """Converts one checkpoint to the GGUF architecture `arch` (see the module docstring)."""

    #: Rows per piece when a large resident tensor (embeddings, output head) is streamed.
    chunk_rows = 8192
    #: llama.cpp's graph reads `{arch}.expert_weights_norm` (no fixed value to warn about).
    llama_cpp_reads_weights_norm = False
    #: The architecture has dense FFN layers, so `write_sizes` writes `{arch}.feed_forward_length`.
    dense_ffn_key = True

    def __init__(self, ckpt: Checkpoint, arch: Arch):
        self.ckpt, self.cfg, self.arch = ckpt, ckpt.config, arch
        self.hp = self.read_hparams()
        norm = self.cfg.get("norm_topk_prob")
        if norm is not None and bool(norm) != arch.expert_weights_norm and not self.llama_cpp_reads_weights_norm:
            log.warning("config.json: norm_topk_prob=%s, written as expert_weights_norm (Strata honours it), but "
                        "llama.cpp's %s graph %s the top-k routing weights; llama.cpp's outputs will differ from "
                        "transformers'", norm, arch.name, "renormalises" if arch.expert_weights_norm else "does not renormalise")
        self.name_map = tensor_name_map(arch, self.n_blocks())

    # ---- config ----

    def get(self, *keys: str, default: Any = _REQUIRED) -> Any:
        """The first of `keys` present (and not null) in config.json, else `default`."""
        for key in keys:
            if self.cfg.get(key) is not None:
                return self.cfg[key]
        if default is _REQUIRED:
            raise ConversionError(f"{self.config_path}: missing {' / '.join(keys)} "
                                  f"(needed for {self.cfg.get('architectures', ['?'])[0]})")
        return default

    @property
    def config_path(self) -> Path:
        return self.ckpt.folder / "config.json"

    def all_rope_parameters(self) -> dict[str, Any]:
        rp = self.cfg.get("rope_parameters") or self.cfg.get("rope_scaling") or {}
        return rp if isinstance(rp, dict) else {}

    def rope_parameters(self) -> dict[str, Any]:
        """The (full-attention layers') rope parameters: rope_theta, rope_type and its fields."""
        rp = self.all_rope_parameters()
        return rp.get("full_attention", rp) if isinstance(rp.get("full_attention"), dict) else rp

    def read_hparams(self) -> HParams:
        n_embd, n_heads = int(self.get("hidden_size")), int(self.get("num_attention_heads"))
        head_dim = int(self.get("head_dim", default=n_embd // n_heads))
        theta = self.get("rope_theta", default=None) or self.rope_parameters().get("rope_theta", 10000.0)
        hp = HParams(
            n_layers=int(self.get("num_hidden_layers")), n_embd=n_embd, n_heads=n_heads,
            n_kv_heads=int(self.get("num_key_value_heads", default=n_heads)), head_dim=head_dim,
            n_vocab=int(self.get("vocab_size")), n_ctx=int(self.get("max_position_embeddings")),
            n_ff=int(self.get("intermediate_size")),
            n_experts=int(self.get("num_local_experts", "num_experts")),
            n_experts_used=int(self.get("num_experts_per_tok")),
            n_ff_exp=int(self.get("moe_intermediate_size", "intermediate_size")),
            rope_theta=float(theta), rms_eps=float(self.get("rms_norm_eps")),
            tied_embeddings=bool(self.get("tie_word_embeddings", default=False)),
            n_ff_shexp=self.shared_ff_length() if self.arch.shared_expert else 0,
        )
        self._refuse_unsupported(hp)
        return hp

    #: The multi-token-prediction blocks kept after the trunk (layer numbers n_layers..), for the
    #: architectures whose converters keep them (`mtp_layers`); none by default.
    mtp: list[int] = []

    def n_blocks(self) -> int:
        """Blocks the file holds: the trunk's, then any multi-token-prediction blocks the converter keeps."""
        return self.hp.n_layers + len(self.mtp)

    def mtp_layers(self, n_layers: int) -> list[int]:
        """The multi-token-prediction blocks to keep: config.json's num_nextn_predict_layers after the
        trunk, where the checkpoint has tensors of them (`model.layers.N.*` with N = n_layers..)."""
        n = int(self.cfg.get("num_nextn_predict_layers") or 0)
        if n and not any(name.startswith(f"model.layers.{n_layers}.") for name in self.ckpt.tensors):
            log.info("config.json: num_nextn_predict_layers=%d but the checkpoint has no tensors of layer %d: "
                     "no multi-token-prediction layers written", n, n_layers)
            return []
        return list(range(n_layers, n_layers + n))

    def shared_ff_length(self) -> int:
        """Rows of the shared expert (all shared experts together), where the architecture has one."""
        return int(self.get("shared_expert_intermediate_size"))

    def _refuse_unsupported(self, hp: HParams) -> None:
        """Config features the GGUF architecture cannot express."""
        if self.arch.same_kv_heads and hp.n_kv_heads != hp.n_heads:
            raise ConversionError(f"{self.config_path}: num_key_value_heads={hp.n_kv_heads} != num_attention_heads="
                                  f"{hp.n_heads}: llama.cpp's {self.arch.name} graph sizes its K norm as the full "
                                  "width and cannot load it")
        for key in self.arch.refused_config:
            if self.cfg.get(key) is not None:
                raise ConversionError(f"{self.config_path}: {key} is not supported by GGUF {self.arch.name}")
        sparse_step, dense = self.get("decoder_sparse_step", default=1), self.get("mlp_only_layers", default=[])
        if sparse_step != 1 or dense:
            raise ConversionError(f"{self.config_path}: dense layers (decoder_sparse_step={sparse_step}, "
                                  f"mlp_only_layers={dense}) are not supported")

    # ---- metadata ----

    def write_sizes(self, w: gguf.GGUFWriter) -> None:
        """The hyperparameter keys every architecture writes first, in llama.cpp's order."""
        hp = self.hp
        w.add_context_length(hp.n_ctx)
        w.add_embedding_length(hp.n_embd)
        w.add_block_count(self.n_blocks())
        if self.dense_ffn_key:
            w.add_feed_forward_length(hp.n_ff)
        w.add_head_count(self.head_count())
        w.add_head_count_kv(hp.n_kv_heads)
        w.add_rope_freq_base(hp.rope_theta)
        w.add_layer_norm_rms_eps(hp.rms_eps)

    def head_count(self) -> int | list[int]:
        """`attention.head_count`: one count, or one per layer where the architecture's layers differ."""
        return self.hp.n_heads

    def write_gqa_sizes(self, w: gguf.GGUFWriter) -> None:
        """write_sizes, the expert counts, and the head size where config.json gives head_dim (GQA
        attention; llama.cpp derives it from the embedding width otherwise)."""
        hp = self.hp
        self.write_sizes(w)
        w.add_expert_count(hp.n_experts)
        w.add_expert_used_count(hp.n_experts_used)
        if self.cfg.get("head_dim") is not None:
            w.add_key_length(hp.head_dim)
            w.add_value_length(hp.head_dim)

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        """Hyperparameter keys (llama.cpp's names through GGUFWriter's helpers)."""
        hp = self.hp
        self.write_gqa_sizes(w)
        self.write_rope_scaling(w)
        self.write_moe_norm(w)
        extra = {Keys.LLM.VOCAB_SIZE: hp.n_vocab, Keys.Rope.DIMENSION_COUNT: hp.head_dim,
                 Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: hp.n_ff_exp,
                 Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: hp.n_ff_shexp}
        for key in self.arch.metadata:
            if key not in extra:
                raise ConversionError(f"architecture {self.arch.name!r}: the converter cannot write metadata {key!r}")
            w.add_uint32(key.format(arch=self.arch.name), extra[key])

    def write_rope_scaling(self, w: gguf.GGUFWriter) -> None:
        """rope.scaling.* from rope_parameters (converters.rope_scaling), and the sliding-window
        layers' own base where the config gives one."""
        write_rope_scaling(w, self.rope_parameters(), self.cfg, self.arch, str(self.config_path))
        swa = self.all_rope_parameters().get("sliding_attention") or {}
        if self.arch.swa and swa.get("rope_theta") is not None:
            w.add_rope_freq_base_swa(float(swa["rope_theta"]))

    def write_moe_norm(self, w: gguf.GGUFWriter) -> None:
        """`expert_weights_norm` from norm_topk_prob where the config has it (llama.cpp reads it
        for deepseek2 only and fixes it per architecture otherwise; Strata honours it)."""
        norm = self.cfg.get("norm_topk_prob")
        if norm is not None:
            w.add_expert_weights_norm(bool(norm))

    def extra_tensors(self) -> list[PlannedTensor]:
        """Tensors computed from the config rather than read: RoPE factors (longrope, llama3)."""
        hp = self.hp  # architectures that read them (write_rope_scaling refuses the others): rotary over the whole head
        factors = rope_factor_tensors(self.rope_parameters(), self.cfg, hp.head_dim, hp.rope_theta, str(self.config_path))
        return [PlannedTensor(weight_name(kind), kind, None, values.shape, gguf.GGMLQuantizationType.F32,
                              [lambda v=values: v.reshape(1, -1)], values.nbytes, ()) for kind, values in factors.items()]

    # ---- tensors ----

    def expected_shape(self, kind: MT) -> tuple[int, ...] | None:
        """Row-major shape a source tensor of `kind` must have (None: not checked)."""
        hp = self.hp
        q, kv = hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim
        return {
            MT.TOKEN_EMBD: (hp.n_vocab, hp.n_embd), MT.OUTPUT: (hp.n_vocab, hp.n_embd),
            MT.OUTPUT_NORM: (hp.n_embd,), MT.ATTN_NORM: (hp.n_embd,), MT.FFN_NORM: (hp.n_embd,),
            MT.ATTN_Q: (q, hp.n_embd), MT.ATTN_K: (kv, hp.n_embd), MT.ATTN_V: (kv, hp.n_embd),
            MT.ATTN_OUT: (hp.n_embd, q), MT.FFN_GATE_INP: (hp.n_experts, hp.n_embd),
            MT.FFN_GATE_EXP: (hp.n_ff_exp, hp.n_embd), MT.FFN_UP_EXP: (hp.n_ff_exp, hp.n_embd),
            MT.FFN_DOWN_EXP: (hp.n_embd, hp.n_ff_exp),
            MT.ATTN_Q_NORM: (hp.head_dim,) if self.arch.qk_norm == "head" else (q,),
            MT.ATTN_K_NORM: (hp.head_dim,) if self.arch.qk_norm == "head" else (kv,),
            MT.FFN_GATE_INP_SHEXP: (1, hp.n_embd),
            MT.FFN_GATE_SHEXP: (hp.n_ff_shexp, hp.n_embd), MT.FFN_UP_SHEXP: (hp.n_ff_shexp, hp.n_embd),
            MT.FFN_DOWN_SHEXP: (hp.n_embd, hp.n_ff_shexp),
        }.get(kind)

    def layer_tensors(self, bid: int) -> tuple[MT, ...]:
        """Per-layer tensors layer `bid` must have (experts are checked separately)."""
        a = self.arch
        return (_LAYER_TENSORS + ((MT.ATTN_Q_NORM, MT.ATTN_K_NORM) if a.qk_norm else ())
                + (_SHARED_TENSORS if a.shared_expert else ())
                + ((MT.FFN_GATE_INP_SHEXP,) if a.shared_expert_gate else ()))

    def transform(self, kind: MT, values: np.ndarray) -> np.ndarray:
        """A resident tensor's values on their way to GGUF: llama's Q/K rows permuted, else unchanged."""
        if kind == MT.ATTN_Q:
            return permute_rope_rows(values, self.hp.n_heads)
        if kind == MT.ATTN_K:
            return permute_rope_rows(values, self.hp.n_kv_heads)
        return values

    def transformed_kinds(self) -> frozenset[MT]:
        """Kinds whose values `transform` changes (they are read whole, not in row chunks)."""
        return frozenset({MT.ATTN_Q, MT.ATTN_K}) if self.arch.permute_qk else frozenset()

    def plan(self, policy: TypePolicy) -> list[PlannedTensor]:
        """Every GGUF tensor of the output, checked against the config, in file order."""
        resident, experts = self._split_sources()
        planned = [p for name, (kind, bid, src) in resident.items()
                   for p in self.plan_resident(kind, name, bid, src, policy)] + self.extra_tensors()
        for bid in self.expert_layers():
            planned += self._plan_experts(bid, experts.get(bid), policy)
        self._check_complete({p.name for p in planned})
        order = {kind: i for i, kind in enumerate(tensor_kinds(self.arch))}
        last = self.n_blocks()
        return sorted(planned, key=lambda p: (-1 if p.kind == MT.TOKEN_EMBD else last if p.layer is None else p.layer,
                                              order.get(p.kind, len(order)), p.name))

    def _split_sources(self) -> tuple[dict[str, tuple[MT, int | None, SourceTensor]], dict[int, dict[str, Any]]]:
        """Resident tensors by GGUF name, and expert sources by layer."""
        resident: dict[str, tuple[MT, int | None, SourceTensor]] = {}
        experts: dict[int, dict[str, Any]] = {}
        for name, src in self.ckpt.tensors.items():
            if m := match_per_expert(name):
                bid, e, part = m
                experts.setdefault(bid, {}).setdefault("per_expert", {})[(part, e)] = src
            elif f := match_fused(name):
                experts.setdefault(f[0], {}).setdefault("fused", {})[f[1]] = src
            elif _IGNORED.search(name):
                continue
            else:
                kind, gname, bid = self._map_resident(name, src)
                if gname in resident:
                    raise ConversionError(f"{src.path}: tensor {name} maps to {gname}, "
                                          f"as does {resident[gname][2].name}")
                resident[gname] = (kind, bid, src)
        return resident, experts

    def _map_resident(self, name: str, src: SourceTensor) -> tuple[MT, str, int | None]:
        found = self.name_map.get_type_and_name(name, try_suffixes=(".weight", ".bias"))
        if found is None:
            raise ConversionError(f"{src.path}: unexpected tensor {name} (no {self.arch.name} GGUF tensor for it)")
        kind, gname = found
        bid = layer_of(gname)
        if bid is not None and bid >= self.n_blocks():
            raise ConversionError(f"{src.path}: unexpected tensor {name}: layer {bid} but config has {self.n_blocks()}")
        return kind, gname, bid

    def _check_shape(self, kind: MT, src: SourceTensor, found: tuple[int, ...]) -> None:
        want = self.expected_shape(kind)
        is_bias = src.name.endswith(".bias")
        if is_bias:
            want = (want[0],) if want else None  # a projection's bias has one entry per output row
        if want is not None and tuple(found) != tuple(want):
            what = "bias" if is_bias else "weight"
            raise ConversionError(f"{src.path}: tensor {src.name}: {what} shape {tuple(found)}, expected {tuple(want)} "
                                  f"from config.json")

    def expert_layers(self) -> range:
        """Layers with routed experts (all of them here; an architecture with dense layers narrows it)."""
        return range(self.hp.n_layers)

    def plan_resident(self, kind: MT, gname: str, bid: int | None, src: SourceTensor,
                      policy: TypePolicy) -> list[PlannedTensor]:
        """The GGUF tensors one resident source tensor becomes (one here; an architecture may split it)."""
        return [self._plan_resident(kind, gname, bid, src, policy)]

    def _plan_resident(self, kind: MT, gname: str, bid: int | None, src: SourceTensor,
                       policy: TypePolicy) -> PlannedTensor:
        self._check_shape(kind, src, src.shape)
        t = policy.choose(kind, src.shape, gname)
        if kind in self.transformed_kinds():
            pieces = [lambda: self.transform(kind, self.ckpt.read_rows(src.name)).reshape(src.shape[0], -1)]
        else:
            rows, step = (src.shape[0] if src.shape else 1), self.chunk_rows
            pieces = [self._row_piece(src, r, min(step, rows - r)) for r in range(0, rows, step)]
        return PlannedTensor(gname, kind, bid, src.shape, t, pieces, src.nbytes, (src.name,))

    def _row_piece(self, src: SourceTensor, first: int, count: int) -> Callable[[], np.ndarray]:
        if not src.shape:
            return lambda: self.ckpt.read_rows(src.name).reshape(1, 1)
        return lambda: self.ckpt.read_rows(src.name, first, count).reshape(count, -1)

    # ---- experts ----

    def _plan_experts(self, bid: int, found: dict[str, Any] | None, policy: TypePolicy) -> list[PlannedTensor]:
        if not found:
            raise ConversionError(f"{self.ckpt.folder}: no expert tensors for layer {bid} "
                                  f"(expected model.layers.{bid}.mlp.experts.* )")
        if "per_expert" in found and "fused" in found:
            raise ConversionError(f"{self.ckpt.folder}: layer {bid} has both per-expert and fused expert tensors")
        source = (self._per_expert_source(bid, found["per_expert"]) if "per_expert" in found
                  else self._fused_source(bid, found["fused"]))
        planned = []
        for part, kind in _EXPERT_PARTS.items():
            rows, cols = self.expected_shape(kind)
            gname = weight_name(kind, bid)
            shape = (self.hp.n_experts, rows, cols)
            pieces = [lambda part=part, e=e: source.read(part, e) for e in range(self.hp.n_experts)]
            planned.append(PlannedTensor(gname, kind, bid, shape, policy.choose(kind, shape, gname),
                                         pieces, source.nbytes(part), source.names(part)))
        return planned

    def _per_expert_source(self, bid: int, srcs: dict[tuple[str, int], SourceTensor]) -> ExpertSource:
        n = self.hp.n_experts
        for part, kind in _EXPERT_PARTS.items():
            for e in range(n):
                src = srcs.get((part, e))
                if src is None:
                    raise ConversionError(f"{self.ckpt.folder}: layer {bid}: missing {part} weight of expert {e} "
                                          f"(found {len([k for k in srcs if k[0] == part])} of {n})")
                self._check_shape(kind, src, src.shape)
        for (part, e), src in sorted(srcs.items()):
            if e >= n:
                raise ConversionError(f"{src.path}: unexpected tensor {src.name}: expert {e} but config has {n} experts")
        return PerExpertSource(self.ckpt, srcs, n)

    def _fused_source(self, bid: int, srcs: dict[str, SourceTensor]) -> ExpertSource:
        hp = self.hp
        for key in ("gate_up_proj", "down_proj"):
            if key not in srcs:
                raise ConversionError(f"{self.ckpt.folder}: layer {bid}: missing model.layers.{bid}.mlp.experts.{key}")
        want = {"gate_up_proj": (hp.n_experts, 2 * hp.n_ff_exp, hp.n_embd),
                "down_proj": (hp.n_experts, hp.n_embd, hp.n_ff_exp)}
        for key, src in srcs.items():
            if src.shape != want[key]:
                raise ConversionError(f"{src.path}: tensor {src.name}: shape {src.shape}, expected {want[key]} "
                                      "from config.json")
        return FusedSource(self.ckpt, srcs["gate_up_proj"], srcs["down_proj"], hp.n_ff_exp, hp.n_embd)

    # ---- completeness ----

    def required(self) -> list[MT]:
        """Global tensors that must be present."""
        req = [MT.TOKEN_EMBD, MT.OUTPUT_NORM]
        return req if self.hp.tied_embeddings else req + [MT.OUTPUT]

    def _check_complete(self, names: set[str]) -> None:
        wanted = [weight_name(k) for k in self.required()]
        for bid in range(self.hp.n_layers):
            wanted += [weight_name(k, bid) for k in self.layer_tensors(bid)]
        missing = [w for w in wanted if w not in names]
        if missing:
            raise ConversionError(f"{self.ckpt.folder}: missing tensors for {', '.join(missing[:5])}"
                                  f"{' ...' if len(missing) > 5 else ''} ({self.cfg.get('architectures', ['?'])[0]} "
                                  f"with {self.hp.n_layers} layers)")
