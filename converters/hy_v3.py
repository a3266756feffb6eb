"""Hunyuan V3 checkpoints (`HYV3ForCausalLM`) -> GGUF `hy_v3`, in the layout llama.cpp's converter writes.

Checkpoints in the released names (`mlp.router.gate`, `mlp.expert_bias`, `mlp.shared_mlp`,
per-expert weights) and in transformers' own (`mlp.gate`, `mlp.e_score_correction_bias`,
`mlp.shared_experts`, fused experts) give the same file. What differs from the generic converter
(`converters.base`):
  * dense FFN layers where `mlp_layer_types` says "dense" (transformers' default: the first layer),
    routed experts where it says "sparse"; no key says which: llama.cpp's loader reads the tensors;
  * per-head q/k norms, no attention biases (llama.cpp's graph has none: attention_bias and
    mlp_bias are refused);
  * one ungated shared expert per MoE layer of num_shared_experts x moe_intermediate_size rows;
  * sigmoid router (expert_gating_func), the selection bias -> the bare `blk.N.exp_probs_b` (F32,
    every MoE layer: the only name llama.cpp's hy_v3 loader reads), top-k weights renormalised
    (transformers always does) and scaled by router_scaling_factor (expert_weights_scale);
  * multi-token-prediction layers (num_nextn_predict_layers blocks past num_hidden_layers, each a
    decoder block with eh_proj, enorm, hnorm and its final_layernorm) are kept where the checkpoint
    has them, as llama.cpp's converter keeps them: `blk.N.nextn.*` (final_layernorm as
    `nextn.shared_head_norm`), block_count counting them and `nextn_predict_layers`; a config that
    names them without their tensors (transformers' own save drops them) gets none.
Must not: write files (the pipeline does) or quantize (types).
"""
from __future__ import annotations


import gguf
from gguf import MODEL_TENSOR as MT
from gguf.constants import ExpertGatingFuncType

from converters.base import Converter, HParams
from converters.biased_router import BiasedRouterMixin, hf_layer
from converters.source import ConversionError, SourceTensor
from strata.arch import weight_name


_DENSE = (MT.FFN_GATE, MT.FFN_UP, MT.FFN_DOWN)
_MOE = (MT.FFN_GATE_INP, MT.FFN_GATE_SHEXP, MT.FFN_UP_SHEXP, MT.FFN_DOWN_SHEXP)
_ATTN = (MT.ATTN_NORM, MT.ATTN_Q, MT.ATTN_K, MT.ATTN_V, MT.ATTN_OUT, MT.ATTN_Q_NORM, MT.ATTN_K_NORM, MT.FFN_NORM)
_NEXTN = (MT.NEXTN_EH_PROJ, MT.NEXTN_ENORM, MT.NEXTN_HNORM)


class HyV3Converter(BiasedRouterMixin, Converter):
    def read_hparams(self) -> HParams:
        hp = super().read_hparams()
        for key in ("attention_bias", "mlp_bias"):
            if self.cfg.get(key):
                raise ConversionError(f"{self.config_path}: {key}=true is not supported (llama.cpp's hy_v3 graph "
                                      "has no biases)")
        self.sparse = self._sparse_layers(hp.n_layers)
        self.mtp = self.mtp_layers(hp.n_layers)
        self.sparse += [i for i in self.mtp if any(f"layers.{i}.mlp.experts." in n for n in self.ckpt.tensors)]
        return hp

    def shared_ff_length(self) -> int:
        return int(self.get("moe_intermediate_size")) * int(self.get("num_shared_experts", default=1))

    def _sparse_layers(self, n_layers: int) -> list[int]:
        """Layers with routed experts, from mlp_layer_types (absent: every layer but the first)."""
        types = self.cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n_layers - 1)
        if len(types) != n_layers or not set(types) <= {"dense", "sparse"}:
            raise ConversionError(f"{self.config_path}: mlp_layer_types {types!r:.120}: expected {n_layers} entries "
                                  "of 'dense' or 'sparse'")
        return [i for i, t in enumerate(types) if t == "sparse"]

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        hp = self.hp
        self.write_gqa_sizes(w)
        self.write_rope_scaling(w)
        w.add_expert_feed_forward_length(hp.n_ff_exp)
        w.add_expert_shared_feed_forward_length(hp.n_ff_shexp)
        w.add_expert_weights_norm(True)
        w.add_expert_weights_scale(float(self.get("router_scaling_factor", default=1.0)))
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
        if self.mtp:
            w.add_nextn_predict_layers(len(self.mtp))

    def expected_shape(self, kind: MT) -> tuple[int, ...] | None:
        hp = self.hp
        own = {MT.FFN_EXP_PROBS_B: (hp.n_experts,), MT.FFN_GATE: (hp.n_ff, hp.n_embd),
               MT.NEXTN_EH_PROJ: (hp.n_embd, 2 * hp.n_embd), MT.NEXTN_ENORM: (hp.n_embd,),
               MT.NEXTN_HNORM: (hp.n_embd,), MT.NEXTN_SHARED_HEAD_NORM: (hp.n_embd,),
               MT.FFN_UP: (hp.n_ff, hp.n_embd), MT.FFN_DOWN: (hp.n_embd, hp.n_ff)}
        return own[kind] if kind in own else super().expected_shape(kind)

    def expert_layers(self) -> list[int]:
        return self.sparse

    def layer_tensors(self, bid: int) -> tuple[MT, ...]:
        return _ATTN + (_MOE if bid in self.sparse else _DENSE)

    def _map_resident(self, name: str, src: SourceTensor):
        if (hf_layer(name) or 0) >= self.hp.n_layers:  # the MTP block's final norm, before the shared head
            name = name.replace(".final_layernorm.", ".shared_head.norm.")
        return super()._map_resident(name, src)

    def _check_complete(self, names: set[str]) -> None:
        super()._check_complete(names)
        missing = [weight_name(k, i) for i in self.mtp for k in self.layer_tensors(i) + _NEXTN
                   if weight_name(k, i) not in names]
        if missing:
            raise ConversionError(f"{self.ckpt.folder}: missing tensors of the multi-token-prediction layers: "
                                  f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")


CONVERTER = HyV3Converter
