"""Qwen3-MoE (`Qwen3MoeForCausalLM`) -> GGUF architecture `qwen3moe`: per-head RMS norms on Q and K,
an explicit head dimension, top-k routing weights renormalised (llama.cpp always does)."""
from __future__ import annotations

import gguf
from gguf import MODEL_TENSOR as MT

from converters.base import Architecture


class Qwen3Moe(Architecture):
    hf_architectures = ("Qwen3MoeForCausalLM",)
    gguf_arch = gguf.MODEL_ARCH.QWEN3MOE
    router_normalizes = True
    layer_tensors = Architecture.layer_tensors + (MT.ATTN_Q_NORM, MT.ATTN_K_NORM)

    def write_extra_metadata(self, w: gguf.GGUFWriter) -> None:
        w.add_expert_feed_forward_length(self.hp.n_ff_exp)

    def expected_shape(self, kind: MT) -> tuple[int, ...] | None:
        if kind in (MT.ATTN_Q_NORM, MT.ATTN_K_NORM):
            return (self.hp.head_dim,)
        return super().expected_shape(kind)
