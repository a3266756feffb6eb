"""Laguna checkpoints (`LagunaForCausalLM`) -> GGUF `laguna`, in the layout llama.cpp's converter writes.

What differs from the generic converter (`converters.base`):
  * `attention.head_count` is written as one count per layer (num_attention_heads_per_layer, else
    num_attention_heads for every layer), as llama.cpp's converter always writes it; q, o and the
    gate are checked against their layer's count;
  * `self_attn.g_proj` -> `attn_gate`: one row per head ("per-head" gating, or `gating: true`) or one
    per feature ("per-element"), per layer from `gating_types` where the config has them;
  * the leading "dense" entries of `mlp_layer_types` -> `leading_dense_block_count` (llama.cpp's
    graph has no dense layer after a sparse one: refused); the others a sigmoid router with the
    selection bias `e_score_correction_bias` -> `exp_probs_b.bias` (F32, every MoE layer),
    renormalised top-k weights times `moe_routed_scaling_factor`, one shared expert of
    `shared_expert_intermediate_size`;
  * RoPE per layer type: the full layers' `rope_parameters.full_attention` (theta, YaRN,
    partial_rotary_factor -> `rope.dimension_count`), the sliding layers' theta and rotary features
    as `rope.freq_base_swa` / `rope.dimension_count_swa` (plain RoPE: another type is refused);
  * `attention.sliding_window` where some layer slides. llama.cpp hard-codes the pattern (full on
    layers 0, 4, 8, ...); where the config's `layer_types` say otherwise the file also carries them as
    `attention.sliding_window_pattern` (one bool per layer, which llama.cpp's loader reads first),
    and a config without sliding layers gets no window, so the file means what transformers computes.
Refused: router logit soft-capping, router weights on the expert input, attention biases (neither
llama.cpp's graph nor Strata has them).
Must not: write files (the pipeline does) or quantize (types).
"""
from __future__ import annotations

import gguf
from gguf import MODEL_TENSOR as MT
from gguf.constants import ExpertGatingFuncType

from converters.base import Converter, HParams, PlannedTensor
from converters.biased_router import BiasedRouterMixin, hf_layer
from converters.rope_scaling import rope_kind
from converters.source import ConversionError, SourceTensor
from converters.types import TypePolicy

_ATTN = (MT.ATTN_NORM, MT.ATTN_Q, MT.ATTN_K, MT.ATTN_V, MT.ATTN_OUT, MT.ATTN_Q_NORM, MT.ATTN_K_NORM, MT.ATTN_GATE,
         MT.FFN_NORM)
PERIOD = 4  # llama.cpp's laguna loader: full attention on layers i % 4 == 0 when the file has a window


class LagunaConverter(BiasedRouterMixin, Converter):
    def read_hparams(self) -> HParams:
        hp = super().read_hparams()
        n = hp.n_layers
        self.heads = [int(h) for h in self.get("num_attention_heads_per_layer", default=[hp.n_heads] * n)]
        self.sliding = [t == "sliding_attention" for t in self.get("layer_types", default=["full_attention"] * n)]
        mlp = self.get("mlp_layer_types", default=["dense"] + ["sparse"] * (n - 1))
        for key, value in (("num_attention_heads_per_layer", self.heads), ("layer_types", self.sliding),
                           ("mlp_layer_types", mlp)):
            if len(value) != n:
                raise ConversionError(f"{self.config_path}: {key} has {len(value)} entries for {n} layers")
        self.n_dense = next((i for i, t in enumerate(mlp) if t != "dense"), n)
        if any(t != "sparse" for t in mlp[self.n_dense:]):
            raise ConversionError(f"{self.config_path}: mlp_layer_types {mlp}: llama.cpp's laguna graph takes dense "
                                  "layers only before the first sparse one")
        bad = [h for h in self.heads if h < 1 or h % hp.n_kv_heads]
        if bad:
            raise ConversionError(f"{self.config_path}: num_attention_heads_per_layer {self.heads}: each a multiple of "
                                  f"num_key_value_heads={hp.n_kv_heads}")
        self.gates = self._gate_types(n)
        self.rope, self.rope_swa = self._rotary(hp.head_dim)
        return hp

    def _refuse_unsupported(self, hp: HParams) -> None:
        super()._refuse_unsupported(hp)
        for key, off in (("moe_router_logit_softcapping", 0.0), ("moe_apply_router_weight_on_input", False),
                         ("attention_bias", False)):
            if (self.cfg.get(key) or off) != off:
                raise ConversionError(f"{self.config_path}: {key}={self.cfg[key]!r} is not supported by GGUF laguna "
                                      "(llama.cpp's graph has no such step)")

    def _gate_types(self, n: int) -> list[bool]:
        """Per layer: whether its output gate is per head (else per element), from gating_types or gating."""
        def per_head(value) -> bool:
            if value is True or str(value).replace("_", "-") == "per-head":
                return True
            if str(value).replace("_", "-") == "per-element":
                return False
            raise ConversionError(f"{self.config_path}: attention gating {value!r}: expected true, 'per-head' or "
                                  "'per-element'")
        types = self.cfg.get("gating_types")
        if types:
            if len(types) != n:
                raise ConversionError(f"{self.config_path}: gating_types has {len(types)} entries for {n} layers")
            return [per_head(t) for t in types]
        return [per_head(self.get("gating", default=True))] * n

    def _rotary(self, head_dim: int) -> tuple[int, int]:
        """Rotary features of full and of sliding layers (head_dim x partial_rotary_factor of each)."""
        rp = self.all_rope_parameters()
        dims = []
        for kind in ("full_attention", "sliding_attention"):
            params = rp.get(kind) if isinstance(rp.get(kind), dict) else {}
            if kind == "sliding_attention" and rope_kind(params) is not None:
                raise ConversionError(f"{self.config_path}: sliding layers' rope type {rope_kind(params)!r}: llama.cpp "
                                      "turns them with plain RoPE")
            factor = float(params.get("partial_rotary_factor", 1.0))
            dim = int(head_dim * factor)
            if not (0 < dim <= head_dim and dim % 2 == 0):
                raise ConversionError(f"{self.config_path}: {kind} partial_rotary_factor {factor} gives {dim} rotary "
                                      f"features of head_dim {head_dim}, expected an even number in 2..{head_dim}")
            dims.append(dim)
        return dims[0], dims[1]

    # ---- metadata ----

    def head_count(self) -> list[int]:
        """One head count per layer, as llama.cpp's converter always writes it."""
        return self.heads

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        hp, c = self.hp, self.cfg
        self.write_gqa_sizes(w)
        self.write_rope_scaling(w)
        w.add_vocab_size(hp.n_vocab)
        if any(self.sliding):
            w.add_sliding_window(int(self.get("sliding_window")))
            if self.sliding != [i % PERIOD != 0 for i in range(hp.n_layers)]:
                w.add_sliding_window_pattern(self.sliding)
        w.add_expert_feed_forward_length(hp.n_ff_exp)
        w.add_expert_shared_feed_forward_length(hp.n_ff_shexp)
        w.add_expert_weights_norm(True)  # transformers' LagunaTopKRouter always renormalises
        w.add_expert_weights_scale(float(c.get("moe_routed_scaling_factor") or 1.0))
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
        w.add_leading_dense_block_count(self.n_dense)
        w.add_rope_dimension_count(self.rope)
        if isinstance(self.all_rope_parameters().get("sliding_attention"), dict):
            w.add_rope_dimension_count_swa(self.rope_swa)

    # ---- tensors ----

    def expected_shape(self, kind: MT) -> tuple[int, ...] | None:
        hp = self.hp
        own = {MT.FFN_EXP_PROBS_B: (hp.n_experts,), MT.FFN_GATE: (hp.n_ff, hp.n_embd),
               MT.FFN_UP: (hp.n_ff, hp.n_embd), MT.FFN_DOWN: (hp.n_embd, hp.n_ff)}
        return own[kind] if kind in own else super().expected_shape(kind)

    def _check_shape(self, kind: MT, src: SourceTensor, found: tuple[int, ...]) -> None:
        bid = hf_layer(src.name)
        if bid is None or kind not in (MT.ATTN_Q, MT.ATTN_OUT, MT.ATTN_GATE) or bid >= self.hp.n_layers:
            return super()._check_shape(kind, src, found)
        D, q = self.hp.n_embd, self.heads[bid] * self.hp.head_dim
        want = {MT.ATTN_Q: (q, D), MT.ATTN_OUT: (D, q),
                MT.ATTN_GATE: (self.heads[bid] if self.gates[bid] else q, D)}[kind]
        if tuple(found) != want:
            what = f" ({'per-head' if self.gates[bid] else 'per-element'} gate)" if kind == MT.ATTN_GATE else ""
            raise ConversionError(f"{src.path}: tensor {src.name}: shape {tuple(found)}, expected {want} for layer "
                                  f"{bid}'s {self.heads[bid]} heads{what} from config.json")

    def _map_resident(self, name: str, src: SourceTensor):
        # transformers keeps the router's selection bias at mlp.gate; its legacy save format (and the
        # released checkpoints) at mlp.experts
        return super()._map_resident(name.replace(".mlp.experts.e_score_correction_bias",
                                                  ".mlp.gate.e_score_correction_bias"), src)

    def plan_resident(self, kind: MT, gname: str, bid: int | None, src: SourceTensor,
                      policy: TypePolicy) -> list[PlannedTensor]:
        if kind == MT.FFN_EXP_PROBS_B:  # a bias vector, F32 whatever the policy
            self._check_shape(kind, src, src.shape)
            return [PlannedTensor(gname, kind, bid, src.shape, gguf.GGMLQuantizationType.F32,
                                  [lambda: self.ckpt.read_rows(src.name).reshape(1, -1)], src.nbytes, (src.name,))]
        return super().plan_resident(kind, gname, bid, src, policy)

    def layer_tensors(self, bid: int) -> tuple[MT, ...]:
        if bid < self.n_dense:
            return _ATTN + (MT.FFN_GATE, MT.FFN_UP, MT.FFN_DOWN)
        return _ATTN + (MT.FFN_GATE_INP, MT.FFN_GATE_SHEXP, MT.FFN_UP_SHEXP, MT.FFN_DOWN_SHEXP)

    def expert_layers(self) -> range:
        return range(self.n_dense, self.hp.n_layers)



CONVERTER = LagunaConverter
