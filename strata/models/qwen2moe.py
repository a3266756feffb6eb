"""Qwen2-MoE (and Qwen1.5-MoE): q/k/v biases, NEOX RoPE, top-k softmax weights not
renormalised, and a shared expert added to every token, scaled by a sigmoid gate."""
from .arch import Architecture

ARCH = Architecture(name="qwen2moe", attn_bias=True, shared_expert=True)
