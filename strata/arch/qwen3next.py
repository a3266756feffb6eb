"""Qwen3-Next (`Qwen3NextForCausalLM`) as GGUF `qwen3next`, the form llama.cpp's converter writes.

Hybrid attention (`Arch.gated_deltanet`): most layers are gated DeltaNet linear attention (a short
causal convolution over [q | k | v], then the gated delta rule's fixed-size recurrent state per
value head, then an RMSNorm gated by silu(z)); every `full_attention_interval`-th layer (or those
`attention.recurrent_layers` marks false) is full attention whose query projection also yields a
per-head output gate (sigmoid), with per-head q/k RMSNorm and NEOX RoPE over the first
`rope.dimension_count` features. Every layer's FFN is MoE: softmax router, top-k, plus a shared
expert scaled by sigmoid(ffn_gate_inp_shexp . x). The checkpoint's (1 + w) norms are stored as
w + 1 by the converter, A_log as ssm_a = -exp(A_log). Multi-token-prediction blocks are not run.
Converter: `converters.qwen3next`.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH, Keys

from .registry import Arch, register

QWEN3NEXT = register(Arch(
    name="qwen3next", tensors=MODEL_ARCH.QWEN3NEXT, hf_architectures=("Qwen3NextForCausalLM",),
    qk_norm="head", expert_weights_norm=True, shared_expert=True, shared_expert_gate=True, post_attention_norm=True,
    gated_deltanet=True, converter="qwen3next",
    metadata=(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH),
))
