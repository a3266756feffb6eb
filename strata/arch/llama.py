"""Mixtral (`MixtralForCausalLM`), stored as GGUF architecture `llama` as llama.cpp's converter
writes it; a `llama` file without experts is a dense Llama and runs too (every layer dense).

Plain pre-norm attention without biases; experts: softmax over the router logits, top-k, weights
renormalised. llama.cpp's `llama` graph rotates adjacent pairs (NORM) while the checkpoint
rotates the two halves of each head, so the converter permutes the rows of Q and K in each head.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH, Keys

from .registry import Arch, register

LLAMA = register(Arch(
    name="llama", tensors=MODEL_ARCH.LLAMA, hf_architectures=("MixtralForCausalLM",),
    rope_type="norm", rope_factors=True, moe=False, expert_weights_norm=True,
    permute_qk=True, metadata=(Keys.LLM.VOCAB_SIZE, Keys.Rope.DIMENSION_COUNT),
))
