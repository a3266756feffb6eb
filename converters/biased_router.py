"""What DeepSeek-V3's router family shares (DeepSeek-V3, GLM-4.x MoE, MiniMax-M2, Hunyuan V3): the
router's selection bias `e_score_correction_bias` -> `blk.N.exp_probs_b.bias` (F32, required where
llama.cpp's loader requires it; the bare `blk.N.exp_probs_b` where the record's
`selection_bias_suffix` says so), and checkpoints whose multi-token-prediction layers (past
num_hidden_layers) are skipped, as llama.cpp's converter does.
Must not: write files (the pipeline does) or quantize (types).
"""
from __future__ import annotations

import logging

from gguf import MODEL_TENSOR as MT

from converters.source import ConversionError, SourceTensor
from strata.arch import weight_name

log = logging.getLogger("strata.convert")

BIAS = "e_score_correction_bias"


class BiasedRouterMixin:
    """Put before `Converter` in the bases; `bias_layers` says which layers must have the bias."""

    def bias_layers(self) -> range:
        return self.expert_layers()

    def _check_complete(self, names: set[str]) -> None:
        super()._check_complete(names)
        suffix = self.arch.selection_bias_suffix
        missing = [name for name in (weight_name(MT.FFN_EXP_PROBS_B, b, suffix) for b in self.bias_layers())
                   if name not in names]
        if missing:
            raise ConversionError(f"{self.ckpt.folder}: missing the router's {BIAS} for {', '.join(missing[:3])}")

    def _split_sources(self):
        """The generic split without the multi-token-prediction layers it does not keep (past n_blocks)."""
        layers, every = self.n_blocks(), self.ckpt.tensors
        keep = {n: t for n, t in every.items() if (hf_layer(n) or 0) < layers}
        if len(keep) < len(every):
            log.info("skipping %d multi-token-prediction tensors (layers >= %d)", len(every) - len(keep), layers)
        self.ckpt.tensors = keep
        try:
            return super()._split_sources()
        finally:
            self.ckpt.tensors = every

    def _map_resident(self, name: str, src: SourceTensor):
        if name.endswith(BIAS):  # gguf-py's table knows it as `e_score_correction.bias`
            kind, _, bid = super()._map_resident(name.replace(BIAS, "e_score_correction"), src)
            return kind, weight_name(kind, bid, self.arch.selection_bias_suffix), bid
        return super()._map_resident(name, src)


def hf_layer(name: str) -> int | None:
    """N of an HF tensor name `model.layers.N.…`, else None."""
    parts = name.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[:2] == ["model", "layers"] and parts[2].isdigit() else None
