"""DeepSeek-V2/V3 checkpoints -> GGUF `deepseek2`, in the layout llama.cpp's converter writes.

What differs from the generic converter (`converters.base`):
  * multi-head latent attention: `q_a`/`q_a_norm`/`q_b` (query LoRA) or `q`, `kv_a_mqa`,
    `kv_a_norm`, and `kv_b_proj` [H*(nope+v), kv_lora] split per head into `attn_k_b`
    [H, kv_lora, nope] (transposed, for the latent decode form) and `attn_v_b` [H, v, kv_lora];
    one KV head of key_length kv_lora + rope and value_length kv_lora, the full head sizes
    under the `_mla` keys;
  * the first `first_k_dense_replace` layers have a dense FFN and no router or experts;
  * shared experts (n_shared_experts x moe_intermediate_size rows, no gate) in every MoE layer;
  * V3's router: selection bias `e_score_correction_bias` -> `exp_probs_b.bias`, sigmoid
    gating, expert groups ("noaux_tc"), renormalised top-k weights scaled by `routed_scaling_factor`;
    V2's: softmax gating, no selection bias, groups only for "group_limited_greedy" (the file
    has no key for V2's group score, the max per group: readers tell it by the absent bias).
Sources are bf16/f16/f32 or block-scaled fp8 (dequantized on read by `converters.source`); multi-token-prediction
layers past num_hidden_layers are skipped, as llama.cpp's converter does.
Must not: write files (the pipeline does) or quantize (types).
"""
from __future__ import annotations

import logging
import math

import gguf
import numpy as np
from gguf import MODEL_TENSOR as MT
from gguf.constants import ExpertGatingFuncType

from converters.base import Converter, HParams, PlannedTensor
from converters.biased_router import BiasedRouterMixin
from converters.rope_scaling import rope_kind
from converters.source import ConversionError, SourceTensor
from converters.types import TypePolicy
from strata.arch import weight_name

log = logging.getLogger("strata.convert")

_V3_TOPK = ("noaux_tc",)
_V2_TOPK = ("greedy", "group_limited_greedy")
_MLA_Q = (MT.ATTN_Q_A, MT.ATTN_Q_A_NORM, MT.ATTN_Q_B)
_MLA_KV = (MT.ATTN_KV_A_MQA, MT.ATTN_KV_A_NORM, MT.ATTN_K_B, MT.ATTN_V_B, MT.ATTN_OUT)


class DeepSeek2Converter(BiasedRouterMixin, Converter):
    llama_cpp_reads_weights_norm = True
    #: config.json architectures with V3's router (the rest are V2's)
    v3_architectures = ("DeepseekV3ForCausalLM",)

    def read_hparams(self) -> HParams:
        c = self.cfg
        self.v3 = (c.get("architectures") or [""])[0] in self.v3_architectures
        self.topk_method = c.get("topk_method") or ("noaux_tc" if self.v3 else "greedy")
        if self.topk_method not in (_V3_TOPK if self.v3 else _V2_TOPK):
            raise ConversionError(f"{self.config_path}: topk_method {self.topk_method!r} is not supported "
                                  f"(expected one of {', '.join(_V3_TOPK if self.v3 else _V2_TOPK)})")
        qc = c.get("quantization_config")
        if qc is not None and (qc.get("quant_method") != "fp8" or qc.get("activation_scheme", "dynamic") != "dynamic"):
            raise ConversionError(f"{self.config_path}: quantization_config {qc!r} is not supported (block-scaled fp8 "
                                  "with dynamic activations is; otherwise convert a bf16 checkpoint)")
        n_embd, n_heads = int(self.get("hidden_size")), int(self.get("num_attention_heads"))
        self.q_lora = c.get("q_lora_rank")
        self.kv_lora, self.rope = int(self.get("kv_lora_rank")), int(self.get("qk_rope_head_dim"))
        self.nope, self.v_dim = int(self.get("qk_nope_head_dim")), int(self.get("v_head_dim"))
        self.n_dense = int(self.get("first_k_dense_replace", default=0))
        self.n_shared = int(self.get("n_shared_experts", default=0))
        rp = self.rope_parameters()
        theta = self.get("rope_theta", default=None) or rp.get("rope_theta", 10000.0)
        n_ff_exp = int(self.get("moe_intermediate_size"))
        return HParams(
            n_layers=int(self.get("num_hidden_layers")), n_embd=n_embd, n_heads=n_heads, n_kv_heads=1,
            head_dim=self.nope + self.rope, n_vocab=int(self.get("vocab_size")),
            n_ctx=int(self.get("max_position_embeddings")), n_ff=int(self.get("intermediate_size")),
            n_experts=int(self.get("n_routed_experts", "num_local_experts")),
            n_experts_used=int(self.get("num_experts_per_tok")), n_ff_exp=n_ff_exp,
            rope_theta=float(theta), rms_eps=float(self.get("rms_norm_eps", default=1e-6)),
            tied_embeddings=bool(self.get("tie_word_embeddings", default=False)),
            n_ff_shexp=n_ff_exp * self.n_shared)

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        hp = self.hp
        self.write_sizes(w)  # one KV head: MLA's shared latent
        w.add_vocab_size(hp.n_vocab)
        if self.q_lora is not None:
            w.add_q_lora_rank(int(self.q_lora))
        w.add_kv_lora_rank(self.kv_lora)
        w.add_key_length(self.kv_lora + self.rope)
        w.add_value_length(self.kv_lora)
        w.add_key_length_mla(self.nope + self.rope)
        w.add_value_length_mla(self.v_dim)
        w.add_rope_dimension_count(self.rope)
        w.add_expert_count(hp.n_experts)
        w.add_expert_used_count(hp.n_experts_used)
        self.write_router(w)
        self.write_rope_scaling(w)
        self.write_yarn_mscale(w)

    def write_router(self, w: gguf.GGUFWriter) -> None:
        """The router's keys: expert and shared-expert sizes, the dense lead, the weights' scale and
        norm, expert groups where routing is group-limited, and the gating function."""
        hp, c = self.hp, self.cfg
        w.add_expert_feed_forward_length(hp.n_ff_exp)
        w.add_expert_shared_count(self.n_shared)
        w.add_leading_dense_block_count(self.n_dense)
        w.add_expert_weights_scale(float(c.get("routed_scaling_factor") or 1.0))
        w.add_expert_weights_norm(bool(c.get("norm_topk_prob")))
        if self.grouped:  # as llama.cpp's converter (which writes them for V2's "greedy" too)
            w.add_expert_group_count(int(c["n_group"]))
            w.add_expert_group_used_count(int(self.get("topk_group")))
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID if self.sigmoid else ExpertGatingFuncType.SOFTMAX)

    @property
    def sigmoid(self) -> bool:
        """Sigmoid router scores: transformers' DeepseekV3TopkRouter always takes them, DeepseekV2TopkRouter softmax."""
        return self.cfg.get("scoring_func", "sigmoid" if self.v3 else "softmax") == "sigmoid"

    def write_yarn_mscale(self, w: gguf.GGUFWriter) -> None:
        """DeepSeek's YaRN magnitudes: mscale_all_dim as yarn_log_multiplier (x 0.1, llama.cpp's
        deepseek2 convention; the attention scale's mscale^2), and transformers' cos/sin factor
        get_mscale(mscale) / get_mscale(mscale_all_dim) (get_mscale(1) without mscale) as
        yarn_attn_factor where it is not 1 (llama.cpp assumes mscale == mscale_all_dim: 1)."""
        rp = self.rope_parameters()
        if rope_kind(rp) != "yarn" or not rp.get("mscale_all_dim") or rp.get("factor") is None:
            return
        mscale_all, mscale, factor = float(rp["mscale_all_dim"]), float(rp.get("mscale") or 0.0), float(rp["factor"])
        w.add_rope_scaling_yarn_log_mul(0.1 * mscale_all)

        def get_mscale(m: float) -> float:
            return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
        cos_sin = get_mscale(mscale) / get_mscale(mscale_all) if mscale else get_mscale(1.0)
        if rp.get("attention_factor") is None and abs(cos_sin - 1.0) > 1e-7:
            w.add_rope_scaling_yarn_attn_factor(cos_sin)

    @property
    def grouped(self) -> bool:
        """Group-limited routing: V3's "noaux_tc", V2's "group_limited_greedy" (V2's "greedy" ignores n_group)."""
        return self.cfg.get("n_group") is not None and self.topk_method != "greedy"

    def expected_shape(self, kind: MT) -> tuple[int, ...] | None:
        hp, H = self.hp, self.hp.n_heads
        q_rows = H * (self.nope + self.rope)
        mla = {
            MT.ATTN_Q: (q_rows, hp.n_embd), MT.ATTN_Q_A: (self.q_lora, hp.n_embd), MT.ATTN_Q_A_NORM: (self.q_lora,),
            MT.ATTN_Q_B: (q_rows, self.q_lora), MT.ATTN_KV_A_MQA: (self.kv_lora + self.rope, hp.n_embd),
            MT.ATTN_KV_A_NORM: (self.kv_lora,), MT.ATTN_KV_B: (H * (self.nope + self.v_dim), self.kv_lora),
            MT.ATTN_OUT: (hp.n_embd, H * self.v_dim), MT.FFN_EXP_PROBS_B: (hp.n_experts,),
            MT.FFN_GATE: (hp.n_ff, hp.n_embd), MT.FFN_UP: (hp.n_ff, hp.n_embd), MT.FFN_DOWN: (hp.n_embd, hp.n_ff),
        }
        return mla[kind] if kind in mla else super().expected_shape(kind)

    def layer_tensors(self, bid: int) -> tuple[MT, ...]:
        q = _MLA_Q if self.q_lora is not None else (MT.ATTN_Q,)
        common = (MT.ATTN_NORM, MT.FFN_NORM) + q + _MLA_KV
        if bid < self.n_dense:
            return common + (MT.FFN_GATE, MT.FFN_UP, MT.FFN_DOWN)
        shared = (MT.FFN_GATE_SHEXP, MT.FFN_UP_SHEXP, MT.FFN_DOWN_SHEXP) if self.n_shared else ()
        return common + (MT.FFN_GATE_INP,) + shared

    def expert_layers(self) -> range:
        return range(self.n_dense, self.hp.n_layers)

    def plan_resident(self, kind: MT, gname: str, bid: int | None, src: SourceTensor,
                      policy: TypePolicy) -> list[PlannedTensor]:
        if kind == MT.FFN_EXP_PROBS_B:
            self._check_shape(kind, src, src.shape)
            return [PlannedTensor(gname, kind, bid, src.shape, gguf.GGMLQuantizationType.F32,
                                  [lambda: self.ckpt.read_rows(src.name).reshape(1, -1)], src.nbytes, (src.name,))]
        if kind != MT.ATTN_KV_B:
            return super().plan_resident(kind, gname, bid, src, policy)
        self._check_shape(kind, src, src.shape)
        H, nope, v, r = self.hp.n_heads, self.nope, self.v_dim, self.kv_lora

        def split() -> tuple[np.ndarray, np.ndarray]:
            kv_b = self.ckpt.read_rows(src.name).reshape(H, nope + v, r)
            return np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1)), np.ascontiguousarray(kv_b[:, nope:])

        out = []
        for k, shape, pick in ((MT.ATTN_K_B, (H, r, nope), 0), (MT.ATTN_V_B, (H, v, r), 1)):
            name = weight_name(k, bid)
            out.append(PlannedTensor(name, k, bid, shape, policy.choose(k, shape, name),
                                     [lambda pick=pick: split()[pick]], src.nbytes // 2, (src.name,)))
        return out

    def bias_layers(self) -> range:
        return self.expert_layers() if self.v3 and self.grouped else range(0)


CONVERTER = DeepSeek2Converter
