"""GLM-4.5 / 4.6 / 4.7 and GLM-4.5-Air (`Glm4MoeForCausalLM`) as GGUF `glm4moe`, the form
llama.cpp's converter writes.

Leading dense layers (`leading_dense_block_count`, optional as llama.cpp reads it); q, k and v
biases where the checkpoint has them (attention_bias), none on the output projection; RMSNorm
of each query and key head before RoPE where the checkpoint has it (use_qk_norm: GLM-4.5, not
-Air); NEOX RoPE over the first `rope.dimension_count` features of each head only
(partial_rotary_factor, 0.5 in the released models); the FFN's pre-norm stored as
`post_attention_norm`. Experts: sigmoid router with a selection bias (`exp_probs_b`), optional
group-limited top-k (n_group; 1 in the released models), top-k weights renormalised
(norm_topk_prob) and scaled by the routed scaling factor; one ungated shared expert
(n_shared_experts x moe_intermediate_size rows). Multi-token-prediction (nextn) blocks are
skipped, as llama.cpp's graph skips them: `nextn_predict_layers` blocks after the trunk are
not run. Converter: `converters.glm4moe`.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH

from .registry import Arch, register

GLM4MOE = register(Arch(
    name="glm4moe", tensors=MODEL_ARCH.GLM4_MOE, hf_architectures=("Glm4MoeForCausalLM",),
    expert_gating_func="sigmoid", qk_norm="head", qk_norm_optional=True, shared_expert=True,
    post_attention_norm=True, converter="glm4moe",
))
