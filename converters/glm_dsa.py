"""GLM-5 checkpoints -> GGUF `glm-dsa`, in the layout llama.cpp's converter writes.

DeepSeek-V3.2's conversion (`converters.deepseek32`: latent attention, the lightning indexer, the
dense lead, shared experts, the biased sigmoid router) with GLM-5's differences:
  * `indexer_types` ("full" / "shared" per layer) -> `attention.indexer.types` (bools), written
    where config.json has it; a shared layer has no indexer tensors;
  * RoPE over qk_rope_head_dim x partial_rotary_factor features (`rope.dimension_count`, 1.0 by
    default, as llama.cpp's converter reads it).
Multi-token-prediction layers are kept as DeepSeek-V3.2's are; their indexer is optional (llama.cpp's
glm-dsa loader does not require it).
Must not: write files (the pipeline does) or quantize (types).
"""
from __future__ import annotations

import gguf
from gguf import MODEL_TENSOR as MT

from converters.base import HParams
from converters.deepseek32 import INDEXER, DeepSeek32Converter
from converters.source import ConversionError
from strata.gguf.indexer import INDEXER_TYPES


class GlmDsaConverter(DeepSeek32Converter):
    v3_architectures = ("GlmMoeDsaForCausalLM",)

    def read_hparams(self) -> HParams:
        hp = super().read_hparams()
        factor = float(self.rope_parameters().get("partial_rotary_factor", 1.0))
        self.rope_dims = int(self.rope * factor)
        types = self.cfg.get("indexer_types")
        if types is not None and (len(types) != hp.n_layers or not set(types) <= {"full", "shared"} or types[0] != "full"):
            raise ConversionError(f"{self.config_path}: indexer_types {types!r}: expected {hp.n_layers} of "
                                  "'full' / 'shared', the first 'full'")
        self.index_full = [t == "full" for t in types] if types is not None else None
        return hp

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        super().write_metadata(w)
        if self.rope_dims != self.rope:  # the key super() wrote: GLM's partial rotary factor
            w.add_rope_dimension_count(self.rope_dims)
        if self.index_full is not None:
            w.add_array(INDEXER_TYPES.format(arch=self.arch.name), self.index_full)

    def layer_tensors(self, bid: int) -> tuple[MT, ...]:
        tensors = super().layer_tensors(bid)
        if self.index_full is None or self.index_full[bid]:
            return tensors
        return tuple(t for t in tensors if t not in INDEXER)

    def mtp_tensors(self, bid: int) -> tuple[MT, ...]:
        return tuple(t for t in super().mtp_tensors(bid) if t not in INDEXER)


CONVERTER = GlmDsaConverter
