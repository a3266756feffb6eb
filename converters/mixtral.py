"""Mixtral (`MixtralForCausalLM`) -> GGUF architecture `llama` with experts.

llama.cpp's `llama` graph applies rotary embeddings to interleaved pairs (GPT-J style) while the
Hugging Face checkpoint rotates the two halves of each head (GPT-NeoX style), so the rows of the Q
and K projections are permuted within each head on the way, as llama.cpp's converter does.
"""
from __future__ import annotations

import gguf
import numpy as np
from gguf import MODEL_TENSOR as MT

from converters.base import Architecture


def permute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder rows (or bias entries) of a Q/K projection from half-split to interleaved rotary
    pairs: per head, rows [0..d/2) and [d/2..d) become 0, d/2, 1, d/2+1, ..."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class Mixtral(Architecture):
    hf_architectures = ("MixtralForCausalLM",)
    gguf_arch = gguf.MODEL_ARCH.LLAMA
    router_normalizes = True

    def write_extra_metadata(self, w: gguf.GGUFWriter) -> None:
        w.add_vocab_size(self.hp.n_vocab)
        w.add_rope_dimension_count(self.hp.head_dim)

    def transformed_kinds(self) -> frozenset[MT]:
        return frozenset({MT.ATTN_Q, MT.ATTN_K})

    def transform(self, kind: MT, values: np.ndarray) -> np.ndarray:
        if kind == MT.ATTN_Q:
            return permute_rope_rows(values, self.hp.n_heads)
        if kind == MT.ATTN_K:
            return permute_rope_rows(values, self.hp.n_kv_heads)
        return values
