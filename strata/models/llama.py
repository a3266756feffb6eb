"""Mixtral, stored as GGUF architecture `llama` (as llama.cpp's converter writes it).

Plain pre-norm attention without biases; the converter permutes the rows of Q and K so that
ggml's NORM RoPE (adjacent pairs) on the file's weights equals the checkpoint's rotate-half
RoPE. Experts: softmax over the router logits, top-k, weights renormalised. A `llama` file
without experts is a dense Llama and runs too (every layer a dense FFN).
"""
from .arch import Architecture

ARCH = Architecture(name="llama")
