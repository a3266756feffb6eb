"""Qwen2-MoE and Qwen1.5-MoE (`Qwen2MoeForCausalLM`): q/k/v biases, NEOX RoPE, top-k softmax
weights not renormalised, and a shared expert added to every token, scaled by a sigmoid gate
(`ffn_gate_inp_shexp`, kept in float32 by the converter).

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH, Keys

from .registry import Arch, register

QWEN2MOE = register(Arch(
    name="qwen2moe", tensors=MODEL_ARCH.QWEN2MOE, hf_architectures=("Qwen2MoeForCausalLM",),
    attn_bias=True, shared_expert=True, shared_expert_gate=True,
    metadata=(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH),
))
