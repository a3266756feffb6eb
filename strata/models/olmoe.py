"""OLMoE: RMSNorm of all query features and of all key features at once (over H*hd and
Hkv*hd, not per head) before NEOX RoPE, top-k softmax weights not renormalised."""
from .arch import Architecture

ARCH = Architecture(name="olmoe", qk_norm="full")
