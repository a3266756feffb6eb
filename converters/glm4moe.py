"""GLM-4.5/4.6/4.7 and GLM-4.5-Air checkpoints -> GGUF `glm4moe`, in the layout llama.cpp's converter writes.

The router, the dense lead, the shared experts and the skipped multi-token-prediction layers
are DeepSeek-V3's (`converters.deepseek2`, whose machinery this reuses); the attention is plain
GQA. What differs from the generic converter (`converters.base`):
  * the first `first_k_dense_replace` layers have a dense FFN and no router or experts;
  * one ungated shared expert of n_shared_experts x moe_intermediate_size rows per MoE layer;
  * sigmoid router, selection bias `e_score_correction_bias` -> `exp_probs_b.bias` (F32, every
    MoE layer: llama.cpp requires it), renormalised top-k weights (norm_topk_prob) times
    `routed_scaling_factor`; expert groups written only when n_group > 1 (llama.cpp's converter
    never writes them; its loader honours them);
  * RoPE over `head_dim * partial_rotary_factor` features (`rope.dimension_count`; llama.cpp's
    default factor 0.5 when the config has none), NEOX order: no Q/K row permutation;
  * q/k/v biases and per-head q/k norms where the checkpoint has them (attention_bias, use_qk_norm);
    the FFN's pre-norm as `post_attention_norm`;
  * multi-token-prediction layers (num_nextn_predict_layers, past num_hidden_layers) are skipped:
    the file's block_count is the trunk's and it has no `nextn_predict_layers`.
Must not: write files (the pipeline does) or quantize (types).
"""
from __future__ import annotations

import gguf
from gguf import MODEL_TENSOR as MT

from converters.base import Converter, HParams
from converters.deepseek2 import DeepSeek2Converter
from converters.source import ConversionError

_ATTN = (MT.ATTN_NORM, MT.ATTN_Q, MT.ATTN_K, MT.ATTN_V, MT.ATTN_OUT, MT.ATTN_POST_NORM)


class Glm4MoeConverter(DeepSeek2Converter):
    def read_hparams(self) -> HParams:
        self.v3, self.topk_method = True, "noaux_tc"  # DeepSeek-V3's router (DeepSeek2Converter.grouped)
        self.q_lora = None
        n_embd, n_heads = int(self.get("hidden_size")), int(self.get("num_attention_heads"))
        head_dim = int(self.get("head_dim", default=n_embd // n_heads))
        factor = float(self.rope_parameters().get("partial_rotary_factor", self.get("partial_rotary_factor", default=0.5)))
        self.rope = int(head_dim * factor)
        if not (0 < self.rope <= head_dim and self.rope % 2 == 0):
            raise ConversionError(f"{self.config_path}: partial_rotary_factor {factor} gives {self.rope} rotary "
                                  f"features of head_dim {head_dim}, expected an even number in 2..{head_dim}")
        self.n_dense = int(self.get("first_k_dense_replace", default=0))
        self.n_shared = int(self.get("n_shared_experts", default=0))
        self.qk_norm = bool(self.get("use_qk_norm", default=False))
        n_ff_exp = int(self.get("moe_intermediate_size"))
        theta = self.get("rope_theta", default=None) or self.rope_parameters().get("rope_theta", 10000.0)
        return HParams(
            n_layers=int(self.get("num_hidden_layers")), n_embd=n_embd, n_heads=n_heads,
            n_kv_heads=int(self.get("num_key_value_heads", default=n_heads)), head_dim=head_dim,
            n_vocab=int(self.get("vocab_size")), n_ctx=int(self.get("max_position_embeddings")),
            n_ff=int(self.get("intermediate_size")), n_experts=int(self.get("n_routed_experts", "num_local_experts")),
            n_experts_used=int(self.get("num_experts_per_tok")), n_ff_exp=n_ff_exp,
            rope_theta=float(theta), rms_eps=float(self.get("rms_norm_eps")),
            tied_embeddings=bool(self.get("tie_word_embeddings", default=False)), n_ff_shexp=n_ff_exp * self.n_shared)

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        self.write_gqa_sizes(w)
        w.add_rope_dimension_count(self.rope)
        self.write_router(w)
        self.write_rope_scaling(w)

    @property
    def grouped(self) -> bool:
        return int(self.cfg.get("n_group") or 1) > 1

    @property
    def sigmoid(self) -> bool:
        return True

    def expected_shape(self, kind: MT) -> tuple[int, ...] | None:
        hp = self.hp
        own = {MT.ATTN_POST_NORM: (hp.n_embd,), MT.FFN_EXP_PROBS_B: (hp.n_experts,),
               MT.FFN_GATE: (hp.n_ff, hp.n_embd), MT.FFN_UP: (hp.n_ff, hp.n_embd), MT.FFN_DOWN: (hp.n_embd, hp.n_ff)}
        return own[kind] if kind in own else Converter.expected_shape(self, kind)

    def layer_tensors(self, bid: int) -> tuple[MT, ...]:
        common = _ATTN + ((MT.ATTN_Q_NORM, MT.ATTN_K_NORM) if self.qk_norm else ())
        if bid < self.n_dense:
            return common + (MT.FFN_GATE, MT.FFN_UP, MT.FFN_DOWN)
        shared = (MT.FFN_GATE_SHEXP, MT.FFN_UP_SHEXP, MT.FFN_DOWN_SHEXP) if self.n_shared else ()
        return common + (MT.FFN_GATE_INP,) + shared

    def bias_layers(self) -> range:
        return self.expert_layers()  # every MoE layer: llama.cpp requires it


CONVERTER = Glm4MoeConverter
