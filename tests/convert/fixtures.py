"""Tiny random MoE checkpoints built with transformers' own classes, and tokenizers trained here.

Sizes are the smallest that still exercise every format: the hidden size and the expert width are
256 so Q4_K blocks (256 values per row block) fit whole rows. Special tokens, the chat template,
the corpus, the byte-level BPE trainer and tokenizer files are `strata.synth`'s, shared with
`strata demo` and `benchmarks/`; what is here needs transformers (the models) or is test-only.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tokenizers import Tokenizer, models, trainers

from tests.convert import mimo2_checkpoint
from strata.synth.tokenizer import CHAT_TEMPLATE, SPECIALS, corpus, save_tokenizer, train_byte_bpe

__all__ = ["CHAT_TEMPLATE", "SPECIALS", "MORE_SPECS", "SPECS", "TRICKY", "Spec", "build_model", "build_multimodal", "corpus", "save_checkpoint",
           "save_tokenizer", "train_byte_bpe", "train_llama_bpe"]

TRICKY = [
    "Hello world", " leading space", "  two leading spaces", "\ttab\tseparated\t", "line one\nline two\n\n",
    "trailing spaces   ", "naïve café über straße", "日本語のテキストと中文", "emoji 🦙🚀 and 👩‍👩‍👧",
    "numbers 3 33 333 3333 3.14159 1e-5", "I've been 'told' he's there, we'll see", "x = f(a, b) // comment\n\tret;",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n", "mixed<|endoftext|>special",
    "\r\n windows\r\nnewlines", "-----======!!!??? ...",
]


@dataclass
class Spec:
    """One architecture's fixture: the transformers classes, config overrides, tokenizer style."""
    key: str
    config_cls: str
    model_cls: str
    config: dict
    tokenizer: str
    dtype: torch.dtype
    chat_template_file: bool
    #: After save_pretrained: fn(model, folder) puts the checkpoint in its released form where transformers'
    #: own differs (config keys, tensors transformers does not hold); None: as transformers saves it.
    finish: Callable[[torch.nn.Module, Path], None] | None = None
    seed: int = 0  # torch's seed for the random weights (one whose results sit on no near-tie)


_COMMON = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=512,
               rms_norm_eps=1e-5, tie_word_embeddings=False)

SPECS = {
    "mixtral": Spec("mixtral", "MixtralConfig", "MixtralForCausalLM",
                    dict(_COMMON, intermediate_size=256, num_key_value_heads=2, num_local_experts=4,
                         num_experts_per_tok=2, rope_theta=10000.0),
                    "llama3", torch.float32, False),
    "qwen2moe": Spec("qwen2moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                     dict(_COMMON, intermediate_size=512, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=256, shared_expert_intermediate_size=512, norm_topk_prob=False),
                     "qwen2", torch.float16, True),
    "qwen3moe": Spec("qwen3moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                     dict(_COMMON, intermediate_size=512, num_key_value_heads=2, head_dim=64, num_experts=4,
                          num_experts_per_tok=2, moe_intermediate_size=256, norm_topk_prob=True),
                     "qwen2", torch.bfloat16, True),
    "olmoe": Spec("olmoe", "OlmoeConfig", "OlmoeForCausalLM",
                  dict(_COMMON, intermediate_size=256, num_key_value_heads=4, num_experts=4, num_experts_per_tok=2,
                       norm_topk_prob=False),
                  "gpt2", torch.float32, False),
}


#: Llama 4's fixtures but for the chunk and the query temperature (see "llama4" below).
_LLAMA4 = dict(_COMMON, num_hidden_layers=4, intermediate_size=256, intermediate_size_mlp=512, num_key_value_heads=2,
               head_dim=64, num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
_MIMO2 = dict(_COMMON, num_hidden_layers=4, intermediate_size=512, moe_intermediate_size=256, num_key_value_heads=1,
              head_dim=96, v_head_dim=64, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
              norm_topk_prob=True, routed_scaling_factor=1.0, sliding_window=8, attention_value_scale=0.707,
              layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
              mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
              rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5000000.0,
                                                  "partial_rotary_factor": 0.334},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 0.334}})
#: DeepSeek-V3's shapes, shared by deepseek3, deepseek32 and glmdsa: 3 layers (1 dense + 2 MoE), query
#: LoRA, latent attention (nope != v head dims), 8 experts in 4 groups (2 used), a shared expert.
_DEEPSEEK3 = dict(_COMMON, num_hidden_layers=3, intermediate_size=512, moe_intermediate_size=256, num_key_value_heads=4,
                  n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
                  first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=64,
                  kv_lora_rank=64, qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=64)
#: The lightning indexer of deepseek32 and glmdsa: 16 heads of 64, the top 8 positions.
_INDEXER = dict(index_n_heads=16, index_head_dim=64, index_topk=8)
#: Architectures with their own model files (MLA, sinks, ...): tested by their own modules, not by
#: every test parameterised over SPECS.
MORE_SPECS = {
    # 3 layers: 1 dense + 2 MoE; query LoRA; 8 experts in 4 groups (2 used), nope != v head dims;
    # YaRN (factor 4 over 128 positions) with DeepSeek's mscale in the attention scale.
    "deepseek3": Spec("deepseek3", "DeepseekV3Config", "DeepseekV3ForCausalLM",
                      dict(_DEEPSEEK3, scoring_func="sigmoid", num_mtp_layers=0, rope_interleave=True,
                           max_position_embeddings=512,
                           rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                                            "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0,
                                            "beta_slow": 1.0, "rope_theta": 10000.0}),
                      "qwen2", torch.float32, True),
    # DeepSeek-V2: 3 layers (1 dense + 2 MoE), no query LoRA (attn_q), softmax router without a
    # selection bias, 8 experts in 4 groups of which only the best one (by its best expert) competes.
    "deepseek2": Spec("deepseek2", "DeepseekV2Config", "DeepseekV2ForCausalLM",
                      dict(_COMMON, num_hidden_layers=3, intermediate_size=512, moe_intermediate_size=256,
                           num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=1,
                           topk_method="group_limited_greedy", n_shared_experts=2, first_k_dense_replace=1,
                           routed_scaling_factor=2.0, q_lora_rank=None, kv_lora_rank=64, qk_rope_head_dim=32,
                           qk_nope_head_dim=32, v_head_dim=64, rope_parameters={"rope_type": "default",
                                                                                "rope_theta": 10000.0}),
                      "qwen2", torch.bfloat16, True),
    # The same V2 form at llama.cpp's "lite" depth (26 layers): llama.cpp reads attn_q (no query
    # LoRA) only for deepseek2 files of 26/27 layers; small widths keep it light (f32 / q8_0 only).
    "deepseek2lite": Spec("deepseek2lite", "DeepseekV2Config", "DeepseekV2ForCausalLM",
                          dict(_COMMON, hidden_size=64, num_hidden_layers=26, intermediate_size=128,
                               moe_intermediate_size=64, num_key_value_heads=4, n_routed_experts=8,
                               num_experts_per_tok=2, n_group=4, topk_group=1, topk_method="group_limited_greedy",
                               n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.0,
                               q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16,
                               v_head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                          "qwen2", torch.bfloat16, True),
    # GLM-4.5: 3 layers (1 dense + 2 MoE), 8 experts (2 used) in one group, a shared expert, q/k head norms and
    # q/k/v biases, RoPE over half of each head; one MTP layer in the config (transformers builds none).
    "glm4moe": Spec("glm4moe", "Glm4MoeConfig", "Glm4MoeForCausalLM",
                    dict(_COMMON, num_hidden_layers=3, intermediate_size=512, moe_intermediate_size=256,
                         num_key_value_heads=2, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
                         n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                         use_qk_norm=True, attention_bias=True, num_nextn_predict_layers=1,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
                    "qwen2", torch.bfloat16, True),
    # Hunyuan V3: 3 layers (dense, then 2 MoE by mlp_layer_types), q/k head norms, 8 experts (2 used) behind a
    # sigmoid router with a selection bias, renormalised and scaled by router_scaling_factor, one shared expert.
    "hyv3": Spec("hyv3", "HYV3Config", "HYV3ForCausalLM",
                 dict(_COMMON, num_hidden_layers=3, intermediate_size=512, moe_intermediate_size=256,
                      num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2, num_shared_experts=1,
                      router_scaling_factor=2.826, mlp_layer_types=["dense", "sparse", "sparse"],
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                 "qwen2", torch.bfloat16, True),
    # 4 layers alternating sliding (window 8, shorter than the test prompts) and full attention,
    # sinks, biases, clamped SwiGLU experts; YaRN with truncated correction dims (llama.cpp's form).
    "gptoss": Spec("gptoss", "GptOssConfig", "GptOssForCausalLM",
                   dict(_COMMON, num_hidden_layers=4, intermediate_size=256, num_key_value_heads=2, head_dim=64,
                        num_local_experts=4, num_experts_per_tok=2, sliding_window=8, max_position_embeddings=131072,
                        rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                         "truncate": True, "original_max_position_embeddings": 4096,
                                         "rope_theta": 150000.0}),
                   "qwen2", torch.bfloat16, True),
    # q/k norms over all heads (4 query, 2 kv heads), RoPE on 32 of 64 head features (rotary_dim),
    # a sigmoid router over 8 experts with a selection bias; MTP off, as the tiny config has none.
    "minimax": Spec("minimax", "MiniMaxM2Config", "MiniMaxM2ForCausalLM",
                    dict(_COMMON, intermediate_size=256, num_key_value_heads=2, head_dim=64, rotary_dim=32,
                         num_local_experts=8, num_experts_per_tok=2, scoring_func="sigmoid", use_mtp=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 5000000.0}),
                    "qwen2", torch.float32, True),
    # Llama 4: 4 layers (dense, MoE, dense, MoE), top-1 of 4 experts + a shared expert, chunks of 8
    # positions (shorter than the test prompts) on layers 0-2, NoPE layer 3 with its query
    # temperature (scale 1.0: it matters) growing every 4 positions; "llama4cpp": llama.cpp's fixed 8192 / 8192 / 0.1.
    "llama4": Spec("llama4", "Llama4TextConfig", "Llama4ForCausalLM",
                   dict(_LLAMA4, attention_chunk_size=8, floor_scale=4, attn_scale=1.0), "qwen2", torch.bfloat16, True),
    "llama4cpp": Spec("llama4cpp", "Llama4TextConfig", "Llama4ForCausalLM",
                      dict(_LLAMA4, attention_chunk_size=8192, floor_scale=8192, attn_scale=0.1), "qwen2", torch.bfloat16,
                      True),
    # DeepSeek-V3.2: deepseek3's shapes (1 dense + 2 MoE, query LoRA, 8 experts in 4 groups) with the
    # lightning indexer: 16 heads of 64 (llama.cpp's multiple of 64; with few heads the ReLU zeroes
    # whole scores, which tie), top 8 positions, fewer than the test prompts, so the selection
    # matters; seed 5: the test sequences' selections survive twice the f16 rounding of the keys.
    "deepseek32": Spec("deepseek32", "DeepseekV32Config", "DeepseekV32ForCausalLM",
                       dict(_DEEPSEEK3, **_INDEXER, scoring_func="sigmoid",
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                       "qwen2", torch.float32, True, seed=5),
    # GLM-5: deepseek32's shapes, 4 layers (1 dense + 3 MoE), 8 experts in one group, the lightning
    # indexer in interleaved RoPE on layers 0 and 2; layers 1 and 3 reuse the choice before them; seed 2:
    # the test sequences' selections survive twice the f16 rounding of the keys.
    "glmdsa": Spec("glmdsa", "GlmMoeDsaConfig", "GlmMoeDsaForCausalLM",
                   dict(_DEEPSEEK3, **_INDEXER, num_hidden_layers=4, n_group=1, topk_group=1,
                        indexer_types=["full", "shared", "full", "shared"],
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                   "qwen2", torch.float32, True, seed=2),
    # Qwen3-Next: 4 layers (3 gated DeltaNet, then full attention with its output gate), 2 key / 4
    # value heads of 32 in the DeltaNet, kernel 4; RoPE on 16 of 64 head features; 4 experts (2
    # used, renormalised) and a gated shared expert on every layer.
    "qwen3next": Spec("qwen3next", "Qwen3NextConfig", "Qwen3NextForCausalLM",
                      dict(_COMMON, num_hidden_layers=4, intermediate_size=512, num_key_value_heads=2, head_dim=64,
                           num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
                           shared_expert_intermediate_size=256, norm_topk_prob=True, linear_num_key_heads=2,
                           linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
                           linear_conv_kernel_dim=4, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                      "partial_rotary_factor": 0.25}),
                      "qwen2", torch.float32, True),
    # Qwen3.5-MoE (text): qwen3next's shapes with 4 value heads over 2 key heads (the tiled reorder
    # matters) and interleaved MRoPE sections [2, 1, 1] over the 8 rotary pairs.
    "qwen35moe": Spec("qwen35moe", "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM",
                      dict(_COMMON, num_hidden_layers=4, num_key_value_heads=2, head_dim=64,
                           num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
                           shared_expert_intermediate_size=256, linear_num_key_heads=2,
                           linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
                           linear_conv_kernel_dim=4, rope_parameters={
                               "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                               "mrope_section": [2, 1, 1], "mrope_interleaved": True}),
                      "qwen2", torch.float32, True),
    # MiMo-V2-Flash: 4 layers (full, sliding, sliding, full; window 8, shorter than the test prompts), 1 kv head on
    # full layers and 2 (doubled) with sinks on sliding ones, key head 96 / value head 64, RoPE on 32 features with
    # a base per layer type, values scaled by 0.707; layer 0 dense, then 8 experts (2 used) under a sigmoid router
    # with a selection bias. Saved in the released config form; "mimo2mtp" adds its 3 MTP layers.
    "mimo2": Spec("mimo2", "MiMoV2FlashConfig", "MiMoV2FlashForCausalLM", _MIMO2, "qwen2", torch.float32, True,
                  finish=mimo2_checkpoint.released),
    "mimo2mtp": Spec("mimo2mtp", "MiMoV2FlashConfig", "MiMoV2FlashForCausalLM", _MIMO2, "qwen2", torch.float32, True,
                     finish=functools.partial(mimo2_checkpoint.released, n_mtp=3)),
    # Laguna (XS.2's form): 4 layers, full attention on layer 0 and sliding (window 8) on 1-3 as
    # llama.cpp hard-codes it (full every 4th from 0); 4 query heads on the full layer, 8 on the
    # sliding ones, 2 kv heads of 64; per-head softplus output gate; RoPE on half of each head at
    # 500000 (full), on all of it at 10000 (sliding); one dense layer, then 8 experts (2 used,
    # sigmoid with a selection bias, scaled 2.5) beside a shared expert wider than a routed one.
    "laguna": Spec("laguna", "LagunaConfig", "LagunaForCausalLM",
                   dict(_COMMON, num_hidden_layers=4, num_attention_heads_per_layer=[4, 8, 8, 8],
                        num_key_value_heads=2, head_dim=64, intermediate_size=512, moe_intermediate_size=256,
                        shared_expert_intermediate_size=512, num_experts=8, num_experts_per_tok=2,
                        moe_routed_scaling_factor=2.5, sliding_window=8, gating=True,
                        layer_types=["full_attention"] + ["sliding_attention"] * 3,
                        mlp_layer_types=["dense"] + ["sparse"] * 3, rope_parameters={
                            "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                                               "original_max_position_embeddings": 128, "partial_rotary_factor": 0.5},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
                   "qwen2", torch.bfloat16, True),
    # Laguna in M.1's form: no sliding window (every layer full), one gate per feature, the same
    # head count on every layer, two leading dense layers.
    "lagunam": Spec("lagunam", "LagunaConfig", "LagunaForCausalLM",
                    dict(_COMMON, num_key_value_heads=2, head_dim=64, intermediate_size=512, moe_intermediate_size=256,
                         shared_expert_intermediate_size=256, num_experts=8, num_experts_per_tok=2, sliding_window=0,
                         gating="per-element", mlp_layer_types=["dense", "dense", "sparse", "sparse"],
                         num_hidden_layers=4, moe_routed_scaling_factor=1.5),
                    "qwen2", torch.bfloat16, True),
}


def _randomize_extras(model: torch.nn.Module) -> None:
    """Give parameters transformers initialises to constants real values: the DeepSeek-V3 router's
    selection bias (zeros) so it changes which experts win, gpt-oss's sinks and biases, GLM's
    attention biases and q/k norms."""
    for name, p in model.named_parameters():
        if name.endswith(("sinks", "_bias", "router.bias")):  # gpt-oss: zeros or uninitialised
            p.normal_(0.0, 0.5 if name.endswith("sinks") else 0.05)
        if model.config.model_type in ("glm4_moe", "hy_v3") and name.endswith(("proj.bias", "_norm.weight")):  # zeros, ones
            p.normal_(1.0 if name.endswith("weight") else 0.0, 0.1)
        if model.config.model_type in ("qwen3_next", "qwen3_5_moe_text") and name.endswith(("norm.weight", "dt_bias")):  # zeros, ones
            p.normal_(0.0 if "norm" in name and "linear_attn" not in name else 1.0, 0.2)
        if model.config.model_type in ("deepseek_v32", "glm_moe_dsa") and "indexer.k_norm" in name:  # ones, zeros
            p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
        if model.config.model_type == "laguna" and name.endswith("norm.weight"):  # ones
            p.normal_(1.0, 0.2)
        if name.endswith("A_log"):  # decays near 1 (A ~ 0.1, not up to 16): the recurrent state carries far
            p.normal_(-2.0, 0.5)
    for m in model.modules():
        if hasattr(m, "topk_method") and hasattr(m, "weight"):  # DeepSeek-V2's router starts at zeros
            m.weight.normal_(0.0, 0.05)
        if hasattr(m, "e_score_correction_bias"):
            m.e_score_correction_bias.normal_(0.0, 0.1)
            getattr(m, "gate", m).weight.normal_(0.0, 0.05)  # MiniMax-M2: the bias sits beside its router


def build_model(spec: Spec, tok: Tokenizer, seed: int | None = None) -> torch.nn.Module:
    """A random model whose logits have real margins: embeddings of unit scale, output head x8.

    Its weights are rounded to the spec's dtype, so the float32 model equals the saved checkpoint.
    seed: torch's seed for the weights (None: the spec's)."""
    import transformers
    vocab = tok.get_vocab_size()
    cfg = getattr(transformers, spec.config_cls)(
        **spec.config, vocab_size=vocab, bos_token_id=None, eos_token_id=tok.token_to_id("<|im_end|>"),
        pad_token_id=tok.token_to_id("<|endoftext|>"))
    torch.manual_seed(spec.seed if seed is None else seed)
    model = getattr(transformers, spec.model_cls)(cfg).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
        model.lm_head.weight.mul_(8.0)
        _randomize_extras(model)
        for p in model.parameters():
            p.copy_(p.to(spec.dtype).to(torch.float32))
        for m in model.modules():  # a buffer the checkpoint stores in its dtype too
            if hasattr(m, "e_score_correction_bias"):
                m.e_score_correction_bias.copy_(m.e_score_correction_bias.to(spec.dtype).float())
    return model


def save_checkpoint(model: torch.nn.Module, spec: Spec, tok: Tokenizer, folder: Path, fused: bool,
                    max_shard_size: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    kwargs = {"save_original_format": not fused}
    if max_shard_size:
        kwargs["max_shard_size"] = max_shard_size
    model.to(spec.dtype).save_pretrained(folder, **kwargs)
    model.to(torch.float32)
    if spec.finish is not None:
        spec.finish(model, folder)
    save_tokenizer(tok, folder, spec.chat_template_file)
    return folder


#: The released multimodal class of a text fixture: (config class, model class, tiny vision config,
#: where the text model's weights go: a prefix for the text model's `model.*` names, one for the rest).
MULTIMODAL = {
    "qwen35moe": ("Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration",
                  dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, spatial_merge_size=2,
                       temporal_patch_size=2, out_hidden_size=256, num_position_embeddings=16),
                  ("model.language_model.", "")),
    "llama4": ("Llama4Config", "Llama4ForConditionalGeneration",
               dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                    vision_output_dim=64, image_size=16, patch_size=4, projector_input_dim=64, projector_output_dim=256),
               ("language_model.model.", "language_model.")),
}


def build_multimodal(key: str, text_model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """transformers' multimodal model for fixture `key` (MULTIMODAL) around `text_model`'s weights,
    with a tiny random vision tower."""
    import transformers
    cfg_cls, model_cls, vision, (inner, outer) = MULTIMODAL[key]
    text = {k: v for k, v in text_model.config.to_dict().items() if k != "architectures"}
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(text_config=text, vision_config=vision))
    weights = {(inner + k.removeprefix("model.") if k.startswith("model.") else outer + k): v
               for k, v in text_model.state_dict().items()}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and all(_TOWER_NAMES.match(k) for k in missing), (missing, unexpected)
    return model.eval()


#: The vision tower's weights in MULTIMODAL's models (left random by build_multimodal).
_TOWER_NAMES = re.compile(r"^(model\.visual|vision_model|multi_modal_projector)\.")


def train_llama_bpe(vocab_size: int = 600) -> Tokenizer:
    """A SentencePiece-style BPE (as Llama/Mistral ship in tokenizer.json): spaces become '▁' with
    one prepended, no pre-tokenizer, byte fallback through <0x00>..<0xFF>; ids 0-2 are <unk>, <s>,
    </s> and 3-258 the bytes, as in those vocabularies."""
    from tokenizers import normalizers
    specials = ["<unk>", "<s>", "</s>"]
    norm = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = norm
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 256, special_tokens=specials, show_progress=False)
    tok.train_from_iterator([line.replace("\n", " ") for line in corpus()], trainer)
    spec = json.loads(tok.to_str())
    trained = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    order = specials + [f"<0x{b:02X}>" for b in range(256)] + [t for t, _ in trained if t not in specials]
    spec["model"]["vocab"] = {t: i for i, t in enumerate(order)}
    spec["added_tokens"] = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, t in enumerate(specials)]
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    return Tokenizer.from_str(json.dumps(spec))
