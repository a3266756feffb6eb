"""MiniMax-M2 checkpoints -> GGUF `minimax-m2`, in the layout llama.cpp's converter writes.

What differs from the generic converter (`converters.base`):
  * partial rotary: `rotary_dim` (or rope_parameters' partial_rotary_factor x head_dim) features
    of each head turn, written as rope.dimension_count;
  * q/k RMSNorm over all heads at once: `attn_q_norm` [H*hd], `attn_k_norm` [Hkv*hd];
  * a sigmoid router (written as expert_gating_func, which llama.cpp's graph needs) with the
    selection bias `block_sparse_moe.e_score_correction_bias` -> `blk.N.exp_probs_b.bias` (F32),
    required in every layer as llama.cpp's loader requires it;
  * multi-token-prediction layers past num_hidden_layers are skipped, as llama.cpp's converter does.
Sources are bf16/f16/f32 or block-scaled fp8 (dequantized on read by `converters.source`).
Must not: write files (the pipeline does) or quantize (types).
"""
from __future__ import annotations

import gguf
from gguf import MODEL_TENSOR as MT
from gguf.constants import ExpertGatingFuncType

from converters.base import Converter, HParams
from converters.biased_router import BiasedRouterMixin
from converters.source import ConversionError


class MiniMaxM2Converter(BiasedRouterMixin, Converter):
    def read_hparams(self) -> HParams:
        hp = super().read_hparams()
        scoring = self.cfg.get("scoring_func") or "sigmoid"
        if scoring != "sigmoid":  # transformers' MiniMaxM2TopKRouter always takes sigmoid scores
            raise ConversionError(f"{self.config_path}: scoring_func {scoring!r} is not supported (expected 'sigmoid')")
        self.rope_dim = self._rotary_dim(hp.head_dim)
        return hp

    def _rotary_dim(self, head_dim: int) -> int:
        """Features of each head that RoPE turns: rotary_dim, else partial_rotary_factor x head_dim."""
        dim = self.cfg.get("rotary_dim")
        if dim is None:
            dim = round(float(self.rope_parameters().get("partial_rotary_factor") or 1.0) * head_dim)
        if not (isinstance(dim, (int, float)) and 0 < dim <= head_dim and int(dim) == dim and dim % 2 == 0):
            raise ConversionError(f"{self.config_path}: rotary_dim {dim!r}: expected an even number in 2..head_dim="
                                  f"{head_dim}")
        return int(dim)

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        super().write_metadata(w)
        w.add_rope_dimension_count(self.rope_dim)
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)

    def expected_shape(self, kind: MT) -> tuple[int, ...] | None:
        return (self.hp.n_experts,) if kind == MT.FFN_EXP_PROBS_B else super().expected_shape(kind)


CONVERTER = MiniMaxM2Converter
