"""gpt-oss as GGUF `gpt-oss`, hyperparameters only (Strata does not build it yet).

Sliding-window attention on alternate layers (attention.sliding_window required), attention
sinks, q/k/v biases and per-expert biases; the router takes a softmax over the chosen top-k
logits (llama.cpp's SOFTMAX_WEIGHT), which is already normalised.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH

from .registry import Arch, register

GPT_OSS = register(Arch(
    name="gpt-oss", tensors=MODEL_ARCH.GPT_OSS, runs=False,
    expert_gating_func="softmax_weight", swa=True, attn_bias=True,
))
