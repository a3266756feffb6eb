"""gpt-oss (`GptOssForCausalLM`) as GGUF `gpt-oss`, the form llama.cpp's converter writes.

Sliding-window attention on even layers (attention.sliding_window required; llama.cpp's swa
pattern 2), full attention on odd ones; attention sinks; biases on q, k, v and the output
projection; NEOX RoPE (YaRN in the released models). Experts: biased gate, up and down, and the
clamped SwiGLU (gate clamped above at `limit`, up to [-limit, limit],
out = (up + 1) * gate * sigmoid(alpha * gate)) with llama.cpp's fixed alpha 1.702 and limit 7.0;
the router has a bias and takes a softmax over the chosen top-k logits (SOFTMAX_WEIGHT). The
FFN's pre-norm is stored as `post_attention_norm`. Converter: `converters.gpt_oss`.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH

from .registry import Arch, register

GPT_OSS = register(Arch(
    name="gpt-oss", tensors=MODEL_ARCH.GPT_OSS, hf_architectures=("GptOssForCausalLM",),
    expert_gating_func="softmax_weight", swa=True, swa_period=2, attn_bias=True, attn_sinks=True,
    attn_out_bias=True, post_attention_norm=True, expert_bias=True, router_bias=True,
    swiglu_clamp=(1.702, 7.0), converter="gpt_oss",
))
