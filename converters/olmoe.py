"""OLMoE (`OlmoeForCausalLM`) -> GGUF architecture `olmoe`: RMS norms over the full Q and K
projections (llama.cpp's loader sizes both as n_embd, so it needs n_kv_heads == n_heads)."""
from __future__ import annotations

import gguf
from gguf import MODEL_TENSOR as MT

from converters.base import Architecture, HParams
from converters.source import ConversionError


class Olmoe(Architecture):
    hf_architectures = ("OlmoeForCausalLM",)
    gguf_arch = gguf.MODEL_ARCH.OLMOE
    router_normalizes = False
    layer_tensors = Architecture.layer_tensors + (MT.ATTN_Q_NORM, MT.ATTN_K_NORM)

    def read_hparams(self) -> HParams:
        hp = super().read_hparams()
        if hp.n_kv_heads != hp.n_heads:
            raise ConversionError(f"{self.ckpt.folder / 'config.json'}: OLMoE with num_key_value_heads="
                                  f"{hp.n_kv_heads} != num_attention_heads={hp.n_heads}: llama.cpp's olmoe "
                                  "graph sizes its K norm as the full width and cannot load it")
        if self.get("clip_qkv", default=None) is not None:
            raise ConversionError(f"{self.ckpt.folder / 'config.json'}: clip_qkv is not supported by GGUF olmoe")
        return hp

    def expected_shape(self, kind: MT) -> tuple[int, ...] | None:
        if kind in (MT.ATTN_Q_NORM, MT.ATTN_K_NORM):
            return (self.hp.n_heads * self.hp.head_dim,)
        return super().expected_shape(kind)
