"""Tencent Hunyuan V3 (Hy3, `HYV3ForCausalLM`) as GGUF `hy_v3`, the form llama.cpp's converter writes.

GQA without biases, RMSNorm of each query and key head (over hd) before NEOX RoPE over the whole
head; dense FFN layers wherever a block has no router (the checkpoint's `mlp_layer_types`, a dense
first layer in the released model: llama.cpp reads no count for them, the tensors say it); MoE
layers: a sigmoid router whose selection bias picks experts but does not weigh them (stored as
`blk.N.exp_probs_b`, no `.bias`: llama.cpp's hy_v3 loader reads that name alone), top-k weights
renormalised and scaled by `expert_weights_scale` (router_scaling_factor), plus one ungated
shared expert (num_shared_experts x moe_intermediate_size rows). llama.cpp's loader takes
sigmoid when `expert_gating_func` is absent. Multi-token-prediction blocks (`nextn_predict_layers`
blocks after the trunk: a whole decoder block with `nextn.eh_proj`, `enorm`, `hnorm` and
`shared_head_norm`) are not run by the main graph.

The installed gguf-py predates `hy_v3`: its tensors are llama.cpp's list (`tensor_set`), named
through EXAONE-MoE's table, which holds every one of them (`strata.arch.tensor_names`).
Converter: `converters.hy_v3`.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH
from gguf.constants import MODEL_TENSOR as MT

from .registry import Arch, register

#: llama.cpp's tensors of `hy_v3` (gguf-py's MODEL_TENSORS[HY_V3] upstream), in its order.
TENSORS = (
    MT.TOKEN_EMBD, MT.OUTPUT_NORM, MT.OUTPUT, MT.ATTN_NORM, MT.ATTN_Q, MT.ATTN_Q_NORM, MT.ATTN_K, MT.ATTN_K_NORM,
    MT.ATTN_V, MT.ATTN_OUT, MT.FFN_NORM, MT.FFN_GATE, MT.FFN_DOWN, MT.FFN_UP, MT.FFN_GATE_INP, MT.FFN_EXP_PROBS_B,
    MT.FFN_GATE_EXP, MT.FFN_DOWN_EXP, MT.FFN_UP_EXP, MT.FFN_GATE_SHEXP, MT.FFN_DOWN_SHEXP, MT.FFN_UP_SHEXP,
    MT.NEXTN_EH_PROJ, MT.NEXTN_EMBED_TOKENS, MT.NEXTN_ENORM, MT.NEXTN_HNORM, MT.NEXTN_SHARED_HEAD_HEAD,
    MT.NEXTN_SHARED_HEAD_NORM,
)

HY_V3 = register(Arch(
    name="hy_v3", tensors=MODEL_ARCH.EXAONE_MOE, tensor_set=TENSORS, hf_architectures=("HYV3ForCausalLM",),
    expert_gating_func="sigmoid", qk_norm="head", shared_expert=True, selection_bias_suffix="", converter="hy_v3",
))
