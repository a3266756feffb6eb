"""Qwen2-MoE (`Qwen2MoeForCausalLM`) -> GGUF architecture `qwen2moe`: routed experts plus one
shared expert whose output is scaled by a sigmoid gate (`ffn_gate_inp_shexp`, kept in float32)."""
from __future__ import annotations

import gguf
from gguf import MODEL_TENSOR as MT

from converters.base import Architecture, HParams
from converters.source import ConversionError


class Qwen2Moe(Architecture):
    hf_architectures = ("Qwen2MoeForCausalLM",)
    gguf_arch = gguf.MODEL_ARCH.QWEN2MOE
    router_normalizes = False
    layer_tensors = Architecture.layer_tensors + (MT.FFN_GATE_INP_SHEXP, MT.FFN_GATE_SHEXP, MT.FFN_UP_SHEXP,
                                                  MT.FFN_DOWN_SHEXP)

    def read_hparams(self) -> HParams:
        hp = super().read_hparams()
        hp.extra["n_ff_shexp"] = int(self.get("shared_expert_intermediate_size"))
        sparse_step, dense = self.get("decoder_sparse_step", default=1), self.get("mlp_only_layers", default=[])
        if sparse_step != 1 or dense:
            raise ConversionError(f"{self.ckpt.folder / 'config.json'}: dense layers (decoder_sparse_step="
                                  f"{sparse_step}, mlp_only_layers={dense}) are not supported")
        return hp

    def write_extra_metadata(self, w: gguf.GGUFWriter) -> None:
        w.add_expert_feed_forward_length(self.hp.n_ff_exp)
        w.add_expert_shared_feed_forward_length(self.hp.extra["n_ff_shexp"])

    def expected_shape(self, kind: MT) -> tuple[int, ...] | None:
        h, s = self.hp.n_embd, self.hp.extra["n_ff_shexp"]
        shared = {MT.FFN_GATE_INP_SHEXP: (1, h), MT.FFN_GATE_SHEXP: (s, h), MT.FFN_UP_SHEXP: (s, h),
                  MT.FFN_DOWN_SHEXP: (h, s)}
        return shared.get(kind) or super().expected_shape(kind)
