"""OLMoE (`OlmoeForCausalLM`): RMSNorm of all query features and of all key features at once
(over H*hd and Hkv*hd, not per head) before NEOX RoPE, top-k softmax weights not renormalised.

llama.cpp's olmoe loader sizes the key norm as the full width n_embd, so it loads only files
with num_key_value_heads == num_attention_heads (as in the released model); GGUF olmoe has no
key for the checkpoint's optional `clip_qkv`.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH

from .registry import Arch, register

OLMOE = register(Arch(
    name="olmoe", tensors=MODEL_ARCH.OLMOE, hf_architectures=("OlmoeForCausalLM",),
    qk_norm="full", same_kv_heads=True, refused_config=("clip_qkv",),
))
