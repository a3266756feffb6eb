"""Qwen3-MoE (`Qwen3MoeForCausalLM`): no attention biases, RMSNorm of each query and key head
(over hd) before NEOX RoPE, an explicit head_dim (need not be D / H), top-k softmax weights
renormalised (llama.cpp's graph always does), no shared expert.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH, Keys

from .registry import Arch, register

QWEN3MOE = register(Arch(
    name="qwen3moe", tensors=MODEL_ARCH.QWEN3MOE, hf_architectures=("Qwen3MoeForCausalLM",),
    expert_weights_norm=True, qk_norm="head",
    metadata=(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH,),
))
