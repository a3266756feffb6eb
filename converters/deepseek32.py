"""DeepSeek-V3.2 checkpoints -> GGUF `deepseek32`, in the layout llama.cpp's converter writes.

DeepSeek-V3's conversion (`converters.deepseek2`: latent attention with kv_b split into k_b and
v_b, the dense lead, shared experts, the biased sigmoid router) plus the lightning indexer of
each layer: `self_attn.indexer.wq_b` -> `indexer.attn_q_b` [Hi*Di, q_lora], `.wk` ->
`indexer.attn_k` [Di, D], `.k_norm` (a LayerNorm: weight and bias) -> `indexer.k_norm`,
`.weights_proj` -> `indexer.proj` [Hi, D]; keys `attention.indexer.head_count` (index_n_heads),
`.key_length` (index_head_dim) and `.top_k` (index_topk). The query LoRA is required (the
indexer's queries come from its latent). Multi-token-prediction layers (num_nextn_predict_layers
blocks past num_hidden_layers: a decoder block with its indexer and experts, plus eh_proj, enorm,
hnorm and the shared head's norm) are kept where the checkpoint has them, as llama.cpp's converter
keeps them: `blk.N.nextn.*`, block_count counting them and `nextn_predict_layers`; a config that
names them without their tensors (transformers' own save drops them) gets none.
Must not: write files (the pipeline does) or quantize (types).
"""
from __future__ import annotations


import gguf
from gguf import MODEL_TENSOR as MT

from converters.base import HParams
from converters.deepseek2 import DeepSeek2Converter
from converters.source import ConversionError
from strata.arch import weight_name


INDEXER = (MT.INDEXER_ATTN_Q_B, MT.INDEXER_ATTN_K, MT.INDEXER_K_NORM, MT.INDEXER_PROJ)
NEXTN = (MT.NEXTN_EH_PROJ, MT.NEXTN_ENORM, MT.NEXTN_HNORM)


class DeepSeek32Converter(DeepSeek2Converter):
    v3_architectures = ("DeepseekV32ForCausalLM",)

    def read_hparams(self) -> HParams:
        hp = super().read_hparams()
        self.index_heads, self.index_dim = int(self.get("index_n_heads")), int(self.get("index_head_dim"))
        self.index_topk = int(self.get("index_topk"))
        if self.q_lora is None:
            raise ConversionError(f"{self.config_path}: q_lora_rank is null: the sparse-attention indexer's queries "
                                  "come from the query LoRA")
        d = self.index_dim
        if d < 64 or d & (d - 1) or d < self.rope:
            raise ConversionError(f"{self.config_path}: index_head_dim={d}: llama.cpp needs a power of two >= 64 and "
                                  f">= qk_rope_head_dim={self.rope} (it turns the indexer heads by one Hadamard matrix)")
        self.mtp = self.mtp_layers(hp.n_layers)
        return hp

    def expert_layers(self) -> list[int]:
        return list(super().expert_layers()) + self.mtp

    def mtp_tensors(self, bid: int) -> tuple[MT, ...]:
        """What MTP block `bid` must have: a MoE decoder block with its indexer, and the projections."""
        return DeepSeek2Converter.layer_tensors(self, bid) + INDEXER + NEXTN

    def _check_complete(self, names: set[str]) -> None:
        super()._check_complete(names)
        missing = [weight_name(k, i) for i in self.mtp for k in self.mtp_tensors(i) if weight_name(k, i) not in names]
        if missing:
            raise ConversionError(f"{self.ckpt.folder}: missing tensors of the multi-token-prediction layers: "
                                  f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        super().write_metadata(w)
        w.add_indexer_head_count(self.index_heads)
        w.add_indexer_key_length(self.index_dim)
        w.add_indexer_top_k(self.index_topk)
        if self.mtp:
            w.add_nextn_predict_layers(len(self.mtp))

    def expected_shape(self, kind: MT) -> tuple[int, ...] | None:
        hp, d = self.hp, self.index_dim
        own = {MT.INDEXER_ATTN_Q_B: (self.index_heads * d, int(self.q_lora)), MT.INDEXER_ATTN_K: (d, hp.n_embd),
               MT.INDEXER_K_NORM: (d,), MT.INDEXER_PROJ: (self.index_heads, hp.n_embd),
               MT.NEXTN_EH_PROJ: (hp.n_embd, 2 * hp.n_embd), MT.NEXTN_ENORM: (hp.n_embd,),
               MT.NEXTN_HNORM: (hp.n_embd,), MT.NEXTN_SHARED_HEAD_NORM: (hp.n_embd,),
               MT.NEXTN_SHARED_HEAD_HEAD: (hp.n_vocab, hp.n_embd), MT.NEXTN_EMBED_TOKENS: (hp.n_vocab, hp.n_embd)}
        return own[kind] if kind in own else super().expected_shape(kind)

    def layer_tensors(self, bid: int) -> tuple[MT, ...]:
        return super().layer_tensors(bid) + INDEXER


CONVERTER = DeepSeek32Converter
