"""Qwen3-MoE: no attention biases, RMSNorm of each query and key head (over hd) before NEOX
RoPE, top-k softmax weights renormalised, no shared expert; head_dim need not be D / H."""
from .arch import Architecture

ARCH = Architecture(name="qwen3moe", qk_norm="head")
