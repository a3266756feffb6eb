"""MiniMax-M2 (`MiniMaxM2ForCausalLM`) as GGUF `minimax-m2`, the form llama.cpp's converter writes.

RMSNorm of all query features and of all key features at once (over H*hd and Hkv*hd, not per
head) before NEOX RoPE over the first `rotary_dim` features of each head only
(rope.dimension_count < head_dim: partial rotary); no attention biases; no shared expert; a
sigmoid router with a selection bias (`exp_probs_b`, the checkpoint's e_score_correction_bias)
that picks experts but does not weigh them, top-k weights renormalised (llama.cpp's graph always
does). The released checkpoints' multi-token-prediction modules are not converted (llama.cpp's
converter skips them too). Converter: `converters.minimax_m2`.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH, Keys

from .registry import Arch, register

MINIMAX_M2 = register(Arch(
    name="minimax-m2", tensors=MODEL_ARCH.MINIMAXM2, hf_architectures=("MiniMaxM2ForCausalLM",),
    expert_gating_func="sigmoid", expert_weights_norm=True, qk_norm="full",
    metadata=(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH,), converter="minimax_m2",
))
